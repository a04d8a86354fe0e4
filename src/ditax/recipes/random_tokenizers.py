"""Small tokenizer folders for the random pipeline folders (``ditax init-random``), each in the
layout its pipeline's ``tokenizer/`` has and that ditax reads offline (the ``tokenizers``
library only; no transformers):

- Wan's UMT5 and FLUX.1's CLIP + T5: the shipped demo models' word tokenizers, copied;
- Gemma (LTX-2): a byte-fallback BPE (Gemma's special tokens, the 256 ``<0xNN>`` byte pieces,
  then pieces learnt from :data:`CORPUS` with spaces as ``▁``), ``<bos> $A``, left padding;
- Qwen3 (FLUX.2 klein) and a Tekken-like Mistral one (FLUX.2 dev): byte-level BPEs learnt from
  :data:`CORPUS`, with the special tokens and a chat template that renders the pipelines'
  prompts as the models' own templates do (:data:`QWEN3_TEMPLATE`, :data:`MISTRAL_TEMPLATE`).

Every text is encodable (bytes); words outside :data:`CORPUS` just take more tokens. Each
function returns ``(files, vocabulary size)``: the folder's files (name → text) and the number
of token ids, added tokens included (the text encoder's ``vocab_size`` must cover it).
"""

from __future__ import annotations

import json
import pathlib

CORPUS = ("a red circle moves right on a dark background", "a blue square goes up and down",
          "a cat walks on the grass in the sunshine", "the camera pans over a snowy mountain",
          "two people dance in a neon lit street at night", "waves crash on the rocks",
          "a portrait of a woman smiling, soft light, high quality, detailed",
          "a car drives through the rain in the city", "close up of a flower opening",
          "You are an AI that reasons about image descriptions.", "user assistant system")
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
MISTRAL_SPECIALS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]",
                    "[/SYSTEM_PROMPT]", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "<pad>")
#: Qwen3's chat template reduced to what the pipelines render (one user turn, a generation
#: prompt, thinking off): the same text as the model's own for those calls
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content"
    " + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>"
    "assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '"
    "<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
#: Mistral Small 3.1's chat template reduced likewise (a system turn, a user turn of text
#: blocks or strings, no generation prompt)
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{%- if message['content'] is string %}"
    "{%- set text = message['content'] %}{%- else %}{%- set text = message['content'][0]"
    "['text'] %}{%- endif %}{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + text"
    " + '[/SYSTEM_PROMPT]' }}{%- elif message['role'] == 'user' %}{{- '[INST]' + text + "
    "'[/INST]' }}{%- else %}{{- text + eos_token }}{%- endif %}{%- endfor %}")


def _folder_files(folder) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(pathlib.Path(folder).iterdir()) if p.is_file()}


def _size(tokenizer_json: str) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True)


def wan_tokenizer() -> tuple[dict[str, str], int]:
    """The shipped Wan demo model's UMT5-style word tokenizer (other words are ``<unk>``)."""
    from ditax.demo import model_path

    files = _folder_files(model_path() / "tokenizer")
    return files, _size(files["tokenizer.json"])


def flux_tokenizers(clip_length: int) -> tuple[dict[str, str], int, dict[str, str], int]:
    """The shipped small Flux's CLIP (``tokenizer/``, ``clip_length`` tokens: the text tower's
    positions) and T5 (``tokenizer_2/``) word tokenizers: ``(clip files, clip vocabulary,
    t5 files, t5 vocabulary)``."""
    from ditax.demo import flux_model_path

    root = flux_model_path()
    clip = _folder_files(root / "tokenizer")
    meta = json.loads(clip["tokenizer_config.json"])
    clip["tokenizer_config.json"] = json.dumps({**meta, "model_max_length": clip_length},
                                               indent=2)
    t5 = _folder_files(root / "tokenizer_2")
    return clip, len(json.loads(clip["vocab.json"])), t5, _size(t5["tokenizer.json"])


def _byte_level_bpe(specials=(), vocab_size: int = 400):
    """A byte-level BPE learnt from :data:`CORPUS` after Qwen's split regex, ``specials``
    first in its vocabulary."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    from ditax.models.encoders.decoder_lm.chat_tokenizer import QWEN_SPLIT

    tok = Tokenizer(BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(CORPUS) * 4, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def qwen3_tokenizer(max_length: int = 40960) -> tuple[dict[str, str], int]:
    """FLUX.2 klein's ``tokenizer/``: a byte-level BPE with Qwen3's special tokens
    (``<|endoftext|>`` pads, ``<|im_start|>`` / ``<|im_end|>`` / ``<think>`` / ``</think>``
    appended) and :data:`QWEN3_TEMPLATE`."""
    from tokenizers import AddedToken

    tok = _byte_level_bpe()
    tok.add_tokens([AddedToken(t, special=True, normalized=False)
                    for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in ("<think>", "</think>")])
    text = tok.to_str()
    config = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": None, "bos_token": None,
              "add_prefix_space": False, "split_special_tokens": False,
              "model_max_length": max_length, "chat_template": QWEN3_TEMPLATE}
    return {"tokenizer.json": text, "tokenizer_config.json": json.dumps(config, indent=2)}, \
        _size(text)


def mistral_tokenizer(max_length: int = 131072) -> tuple[dict[str, str], int]:
    """FLUX.2 dev's ``tokenizer/``: a Tekken-like byte-level BPE (Mistral's special tokens
    first, ``<s> $A``), left padding with ``<pad>``, :data:`MISTRAL_TEMPLATE`."""
    from tokenizers import processors

    tok = _byte_level_bpe(MISTRAL_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    text = tok.to_str()
    config = {"tokenizer_class": "LlamaTokenizerFast", "processor_class": "PixtralProcessor",
              "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "pad_token": "<pad>", "padding_side": "left", "model_max_length": max_length,
              "chat_template": MISTRAL_TEMPLATE}
    return {"tokenizer.json": text, "tokenizer_config.json": json.dumps(config, indent=2)}, \
        _size(text)


def gemma_tokenizer(max_length: int = 1024) -> tuple[dict[str, str], int]:
    """LTX-2's ``tokenizer/``: a byte-fallback BPE laid out as Gemma's (module docstring),
    ``<start_of_turn>`` / ``<end_of_turn>`` added."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
    from tokenizers.models import BPE

    learn = Tokenizer(BPE())
    learn.normalizer = normalizers.Replace(" ", "\u2581")
    learn.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    learn.train_from_iterator(list(CORPUS) * 4, trainer=trainers.BpeTrainer(
        vocab_size=300, show_progress=False))
    model = json.loads(learn.to_str())["model"]
    pieces = sorted(model["vocab"], key=model["vocab"].get)
    words = list(GEMMA_SPECIALS) + [f"<0x{b:02X}>" for b in range(256)] + pieces
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(BPE(vocab={w: i for i, w in enumerate(words)}, merges=merges,
                        unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
    tok.add_tokens([AddedToken(t, special=True, normalized=False)
                    for t in ("<start_of_turn>", "<end_of_turn>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)])
    text = tok.to_str()
    config = {"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
              "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>",
              "padding_side": "left", "add_bos_token": True, "add_eos_token": False,
              "extra_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
              "model_max_length": max_length}
    return {"tokenizer.json": text, "tokenizer_config.json": json.dumps(config, indent=2)}, \
        _size(text)


__all__ = ["CORPUS", "MISTRAL_TEMPLATE", "QWEN3_TEMPLATE", "flux_tokenizers", "gemma_tokenizer",
           "mistral_tokenizer", "qwen3_tokenizer", "wan_tokenizer"]
