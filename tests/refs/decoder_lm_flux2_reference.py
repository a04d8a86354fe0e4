"""Tiny random FLUX.2 text encoders (transformers' Qwen3ForCausalLM and
Mistral3ForConditionalGeneration) and tiny byte-level BPE tokenizers with the real chat
templates, saved in their own folder formats, for the decoder-LM FLUX.2 tests."""

from __future__ import annotations

import json

import numpy as np

from gemma_reference import rel_err

__all__ = ["rel_err", "tiny_flux2_text_folders", "hidden_states", "make_qwen3", "make_mistral3",
           "save_qwen3_tokenizer", "save_mistral_tokenizer", "QWEN3_TEMPLATE",
           "MISTRAL_TEMPLATE", "PROMPTS", "TEXT"]

CORPUS = ["a cat walks on the grass in the sunshine", "A dog runs along the beach at sunset",
          "the camera pans slowly over a snowy mountain range", "café naïve crème brûlée",
          "two people dance in a neon lit street at night", "it's 2024 and we're here: 3 cats",
          "You are an AI that reasons about image descriptions.", "user assistant system"]

PROMPTS = ["a cat walks on the grass", "  A   dog\truns  along the beach,\nat sunset!  ",
           "Café ÜBER 東京 😀 x [IMG]", "", "two people dance in a neon lit street, " * 5]

# Qwen3's chat template (the hub models' tokenizer_config.json chat_template)
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# Mistral Small 3.1's chat template (its default system message shortened)
MISTRAL_TEMPLATE = r"""{%- set today = strftime_now("%Y-%m-%d") %}
{%- set default_system_message = "You are Mistral Small 3. The current date is " + today + "." %}

{{- bos_token }}

{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set system_message = messages[0]['content'] %}
    {%- else %}
        {%- set system_message = messages[0]['content'][0]['text'] %}
    {%- endif %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}

{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if message['content'] is string %}
            {{- '[INST]' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST]' }}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}
                    {{- block['text'] }}
                {%- elif block['type'] in ['image', 'image_url'] %}
                    {{- '[IMG]' }}
                {%- else %}
                    {{- raise_exception('Only text and image blocks are supported in message content!') }}
                {%- endif %}
            {%- endfor %}
            {{- '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'system' %}
        {{- '[SYSTEM_PROMPT]' + (message['content'] if message['content'] is string else message['content'][0]['text']) + '[/SYSTEM_PROMPT]' }}
    {%- elif message['role'] == 'assistant' %}
        {{- message['content'] + eos_token }}
    {%- else %}
        {{- raise_exception('Only user, system and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}"""

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Tekken's (Mistral Small 3.x) pre-tokenizer split
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]",
                    "[/SYSTEM_PROMPT]", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "<pad>"]


def byte_level_bpe(split: str, specials=(), vocab_size: int = 420):
    """A ``tokenizers.Tokenizer``: byte-level BPE trained on :data:`CORPUS` after the
    ``split`` regex, ``specials`` first in its vocabulary."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 4, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def save_qwen3_tokenizer(folder):
    """transformers 5's ``Qwen2Tokenizer`` of a tiny byte-level BPE, with Qwen3's special tokens
    and chat template, saved as klein's ``tokenizer/``; returns it as loaded back."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, Qwen2Tokenizer

    model = json.loads(byte_level_bpe(QWEN_SPLIT).to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>",
                         add_prefix_space=False)
    tok.add_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>")])
    tok.add_tokens([AddedToken(t, special=False) for t in ("<think>", "</think>")])
    tok.chat_template = QWEN3_TEMPLATE
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def save_mistral_tokenizer(folder, padding_side="left"):
    """A Tekken-like byte-level BPE (Mistral's special tokens first, ``<s> $A``
    post-processor) with Mistral Small 3.1's chat template, saved as transformers 5 saves
    FLUX.2 dev's ``tokenizer/`` (declared a ``LlamaTokenizerFast``, as the hub's is); returns
    it as ``AutoTokenizer`` loads it back."""
    from tokenizers import processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    backend = byte_level_bpe(TEKKEN_SPLIT, MISTRAL_SPECIALS)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", pad_token="<pad>",
                                  padding_side=padding_side)
    tok.chat_template = MISTRAL_TEMPLATE
    tok.save_pretrained(folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class="LlamaTokenizerFast", processor_class="PixtralProcessor")
    cfg_path.write_text(json.dumps(cfg))
    return AutoTokenizer.from_pretrained(folder)


TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6)


def _perturb(named_parameters, seed):
    """Norm gains around 1 (±0.3), the rest scaled to unit-variance outputs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in named_parameters:
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def make_qwen3(vocab_size, seed=0, **text):
    """A random ``Qwen3ForCausalLM`` (:data:`TEXT` shapes, rope theta 1e6 as Qwen3 ships)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(**{**TEXT, "vocab_size": vocab_size, "tie_word_embeddings": True,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                         **text})
    model = Qwen3ForCausalLM(cfg).eval()
    _perturb(model.model.named_parameters(), seed + 1)
    return model


def make_mistral3(vocab_size, seed=0, **text):
    """A random ``Mistral3ForConditionalGeneration`` (tiny Pixtral tower; :data:`TEXT`
    shapes, rope theta 1e9 as Mistral Small 3.1 ships; ``head_dim`` not
    ``hidden_size / heads``)."""
    import torch
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = Mistral3Config(
        text_config=dict(TEXT, model_type="mistral", vocab_size=vocab_size, head_dim=12,
                         rope_theta=1e9, sliding_window=None, **text),
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, head_dim=8,
                           image_size=28, patch_size=14),
        image_token_index=7)
    model = Mistral3ForConditionalGeneration(cfg).eval()
    _perturb(model.model.language_model.named_parameters(), seed + 1)
    return model


def hidden_states(model, ids, mask):
    """Every hidden state of ``model`` (the pipelines' call), stacked ``[L+1, B, T, D]``."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(np.asarray(ids, np.int64)),
                    attention_mask=torch.from_numpy(np.asarray(mask, np.int64)),
                    output_hidden_states=True, use_cache=False)
    return np.stack([h.numpy() for h in out.hidden_states])


_FOLDERS: dict = {}


def tiny_flux2_text_folders():
    """{"klein": (folder, Qwen3ForCausalLM, tokenizer), "dev": (folder, Mistral3 model,
    tokenizer)}: folders laid out as the pipelines' ``text_encoder/`` + ``tokenizer/``, and
    the torch / transformers objects loaded back from them; built once per process."""
    if not _FOLDERS:
        import atexit
        import shutil
        import tempfile
        from pathlib import Path

        from transformers import Mistral3ForConditionalGeneration, Qwen3ForCausalLM

        root = Path(tempfile.mkdtemp(prefix="ditax_flux2_text_"))
        atexit.register(shutil.rmtree, root, True)
        qtok = save_qwen3_tokenizer(root / "klein" / "tokenizer")
        make_qwen3(len(qtok)).save_pretrained(root / "klein" / "text_encoder")
        qwen = Qwen3ForCausalLM.from_pretrained(root / "klein" / "text_encoder").eval()
        mtok = save_mistral_tokenizer(root / "dev" / "tokenizer")
        make_mistral3(len(mtok)).save_pretrained(root / "dev" / "text_encoder")
        mistral = Mistral3ForConditionalGeneration.from_pretrained(
            root / "dev" / "text_encoder").eval()
        _FOLDERS.update(klein=(root / "klein", qwen, qtok), dev=(root / "dev", mistral, mtok))
    return _FOLDERS
