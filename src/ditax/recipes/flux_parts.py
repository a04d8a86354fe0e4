"""The pieces of the small Flux's ``FluxPipeline`` folder that are not trained by a ditax
trainer (:mod:`ditax.recipes.flux_demo_model`): the two tokenizers trained on the demo
vocabulary, the frozen random CLIP and T5 text towers, the scheduler and ``model_index.json``,
the trained transformer's export; and the prompt-following score of a folder over seeds.

The CLIP tokenizer is a byte-level BPE with ``</w>`` word ends (FLUX.1's ``CLIPTokenizer``
layout: ``vocab.json`` + ``merges.txt``) whose merges are learnt from the prompts, so every
vocabulary word is one token; the T5 one is a Unigram ``tokenizer.json``
whose pieces are the words. Both towers are random and never trained: a fixed
embedding of the words, as for the Wan demo's UMT5.
"""

from __future__ import annotations

import json
import pathlib

SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
             "shift": 3.0, "use_dynamic_shifting": False}
MODEL_INDEX = {"_class_name": "FluxPipeline", "_diffusers_version": "0.35.0",
               "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
               "text_encoder": ["transformers", "CLIPTextModel"],
               "text_encoder_2": ["transformers", "T5EncoderModel"],
               "tokenizer": ["transformers", "CLIPTokenizer"],
               "tokenizer_2": ["transformers", "T5TokenizerFast"],
               "transformer": ["diffusers", "FluxTransformer2DModel"],
               "vae": ["diffusers", "AutoencoderKL"]}
BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def corpus() -> list[str]:
    """Every canonical prompt, held-out combinations too (their words are the vocabulary's;
    only the combinations are held out of training)."""
    from ditax.synthetic.images import all_placements

    return [p.prompt for p in all_placements()]


def write_clip_tokenizer(folder, max_length: int, vocab_size: int = 400) -> dict:
    """A byte-level BPE with ``</w>`` word ends trained on :func:`corpus` → ``vocab.json``,
    ``merges.txt``, ``tokenizer_config.json`` (``model_max_length``); returns the vocab."""
    from tokenizers import Tokenizer, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  end_of_word_suffix="</w>", show_progress=False)
    tok.train_from_iterator(corpus() * 4, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(model["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS, "unk_token": EOS,
         "model_max_length": max_length, "tokenizer_class": "CLIPTokenizer"}, indent=2))
    return model["vocab"]


def write_clip_text(folder, config: dict, vocab: dict, seed: int) -> None:
    """A random CLIP text tower (transformers ``CLIPTextModel`` folder) over ``vocab``."""
    from ditax.io.export import module_params, save_folder
    from ditax.models.encoders.clip.text import CLIPTextConfig, CLIPTextEncoder
    from ditax.models.encoders.clip.text_loading import text_weight_table
    from ditax.train.vae import init_replicated

    hf = dict(config, vocab_size=len(vocab), eos_token_id=vocab[EOS],
              bos_token_id=vocab[BOS], pad_token_id=vocab[EOS])
    cfg = CLIPTextConfig.from_hf(hf)
    save_folder(folder, "model.safetensors", text_weight_table(cfg),
                module_params(init_replicated(lambda r: CLIPTextEncoder(cfg, rngs=r), seed)),
                {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model", **hf})


def write_t5(folder, config: dict, seed: int) -> None:
    """A random T5 encoder (transformers ``T5EncoderModel`` folder)."""
    from ditax.io.export import module_params, save_folder
    from ditax.models.encoders.t5 import T5Config, T5Encoder, weight_table
    from ditax.train.vae import init_replicated

    cfg = T5Config.from_hf(config)
    save_folder(folder, "model.safetensors", weight_table(cfg),
                module_params(init_replicated(lambda r: T5Encoder(cfg, rngs=r), seed)),
                {"architectures": ["T5EncoderModel"], "model_type": "t5", **config})


def write_t5_tokenizer(folder) -> int:
    """A T5-style Unigram ``tokenizer.json`` (``<pad>`` = 0, ``</s>`` = 1, ``<unk>`` = 2)
    whose pieces are the words of :func:`corpus` (``▁word``, scored by their log frequency:
    the maximum-likelihood unigram model of a closed vocabulary, one token a word) and the
    single characters; returns its size."""
    import collections
    import math

    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import Unigram

    words = collections.Counter(w for line in corpus() for w in line.split())
    total = sum(words.values())
    chars = sorted({c for w in words for c in w})
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + w, math.log(n / total)) for w, n in sorted(words.items())]
    pieces += [(c, math.log(1 / total) - 10.0) for c in ["\u2581", *chars]]
    tok = Tokenizer(Unigram(pieces, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                       special_tokens=[("</s>", 1)])
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
         "model_max_length": 512, "tokenizer_class": "T5TokenizerFast"}, indent=2))
    return tok.get_vocab_size()


def write_encoders(folder, *, clip: dict, t5: dict, seed: int) -> dict:
    """Tokenizers and text towers of a ``FluxPipeline`` folder; returns their sizes."""
    folder = pathlib.Path(folder)
    vocab = write_clip_tokenizer(folder / "tokenizer", clip["max_position_embeddings"])
    write_clip_text(folder / "text_encoder", clip, vocab, seed)
    n = write_t5_tokenizer(folder / "tokenizer_2")
    write_t5(folder / "text_encoder_2", dict(t5, vocab_size=n), seed + 1)
    return {"clip_vocab": len(vocab), "t5_vocab": n}


def write_pipeline_files(folder) -> None:
    """``scheduler/`` and ``model_index.json``."""
    folder = pathlib.Path(folder)
    (folder / "scheduler").mkdir(parents=True, exist_ok=True)
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER, indent=2))
    (folder / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))


def write_transformer(folder, transformer: dict, params, dtype: str) -> None:
    """Trained parameters → a diffusers ``FluxTransformer2DModel`` folder."""
    import jax
    import numpy as np

    from ditax.io.export import save_folder
    from ditax.models.flux.config import FluxConfig
    from ditax.models.flux.convert import weight_table

    cfg = FluxConfig.from_diffusers(transformer)
    save_folder(folder, "diffusion_pytorch_model.safetensors", weight_table(cfg),
                jax.tree.map(np.asarray, params), cfg.to_diffusers(), dtype=dtype)


def score_folder(folder, sample: dict, seeds=(0, 1, 2), prompts=None, pipe=None) -> dict:
    """Prompt following of the pipeline ``folder`` sampled with ``sample`` (the call's keyword
    arguments): every combination (default; or ``prompts``) at each seed, scored by
    :func:`ditax.synthetic.images.score_image`. Returns per-seed and overall shares of colour /
    shape / position right, for the seen and the held-out combinations, and the rows."""
    from ditax.pipelines.flux.loading import load_pipeline
    from ditax.synthetic.images import HELD_OUT, all_placements, parse_image_prompt, score_image

    pipe = pipe or load_pipeline(folder)
    prompts = list(prompts or [p.prompt for p in all_placements()])
    rows = []
    for seed in seeds:
        for prompt in prompts:
            sc = score_image(pipe(prompt, seed=seed, progress=False, **sample), prompt)
            rows.append({"seed": seed, "prompt": prompt,
                         "held_out": parse_image_prompt(prompt) in HELD_OUT,
                         **{k: sc[f"{k}_correct"] for k in ("colour", "shape", "position")}})

    def share(sel):
        return {k: round(sum(r[k] for r in sel) / len(sel), 4) for k in
                ("colour", "shape", "position")} | {"images": len(sel)} if sel else {}

    out = {}
    for name, held in (("seen", False), ("held_out", True)):
        sel = [r for r in rows if r["held_out"] == held]
        out[name] = share(sel)
        out[f"{name}_per_seed"] = {s: share([r for r in sel if r["seed"] == s]) for s in seeds}
    out["rows"] = rows
    return out


__all__ = ["SCHEDULER", "MODEL_INDEX", "corpus", "write_clip_tokenizer", "write_clip_text",
           "write_t5", "write_t5_tokenizer", "write_encoders", "write_pipeline_files",
           "write_transformer", "score_folder"]
