"""The random-weights Wan pipeline folder of the demo's shapes (a D=128 transformer,
16-channel latents, a 64-wide UMT5 and a tokenizer trained on a few lines): what tests and
benchmarks use for a small Wan pipeline of any shape (:func:`build_pipeline_folder`), and the
tokenizer and text encoder writers the demo model's recipe (:mod:`ditax.recipes.demo_model`)
trains its folder with.
"""

from __future__ import annotations

import json
import pathlib

# small but not trivial: D=128 transformer, 16-channel latents, 64-wide UMT5
TRANSFORMER = dict(patch_size=[1, 2, 2], num_attention_heads=4, attention_head_dim=32,
                   in_channels=16, out_channels=16, text_dim=64, freq_dim=64, ffn_dim=256,
                   num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                   eps=1e-6, rope_max_seq_len=1024, image_dim=None, added_kv_proj_dim=None)
VAE = dict(base_dim=16, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
           temperal_downsample=[False, True, True], dropout=0.0,
           latents_mean=[0.0] * 16, latents_std=[1.0] * 16)
UMT5 = dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
            relative_attention_num_buckets=32, relative_attention_max_distance=128,
            layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu")
SCHEDULER = dict(_class_name="UniPCMultistepScheduler", num_train_timesteps=1000,
                 prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                 solver_order=2, solver_type="bh2", lower_order_final=True)
CORPUS = [
    "a cat walks on the grass in the sun", "a dog runs along the beach at sunset",
    "two people dance in a neon lit street at night", "close up of a flower opening",
    "a red car drives through the rain", "waves crash on the rocks under a grey sky",
    "a bird flies over a green valley", "blurry, low quality, static, worst quality",
]


def write_transformer(folder: pathlib.Path, seed: int = 0):
    """Random Wan transformer → diffusers ``WanTransformer3DModel`` safetensors + config."""
    from ditax.config import ModelConfig
    from ditax.io.export import module_params, save_folder
    from ditax.models.wan.convert import weight_table
    from ditax.models.wan.build import init_model

    cfg = ModelConfig.from_diffusers(TRANSFORMER)
    save_folder(folder, "diffusion_pytorch_model.safetensors",
                weight_table(cfg.num_layers, cfg.cross_attn_norm, head_dim=cfg.attention_head_dim),
                module_params(init_model(cfg, seed=seed)),
                {"_class_name": "WanTransformer3DModel", **TRANSFORMER})


def write_vae(folder: pathlib.Path, seed: int = 1):
    """Random Wan VAE → diffusers ``AutoencoderKLWan`` safetensors + config."""
    from flax import nnx

    from ditax.io.export import module_params, save_folder
    from ditax.models.vae.wan import WanVAE, WanVAEConfig
    from ditax.models.vae.wan.convert import weight_table

    vae = WanVAE(WanVAEConfig.from_diffusers(VAE), rngs=nnx.Rngs(seed))
    save_folder(folder, "diffusion_pytorch_model.safetensors", weight_table(vae),
                module_params(vae), {"_class_name": "AutoencoderKLWan", **VAE})


def write_text_encoder(folder: pathlib.Path, seed: int = 2, config: dict | None = None):
    """Random UMT5 encoder (``config``: transformers ``UMT5Config`` fields, default
    :data:`UMT5`) → transformers ``UMT5EncoderModel`` safetensors + config."""
    from flax import nnx

    from ditax.io.export import module_params, save_folder
    from ditax.models.encoders.t5 import weight_table
    from ditax.models.encoders.umt5 import UMT5Config, UMT5Encoder

    config = config or UMT5
    cfg = UMT5Config.from_hf(config)
    save_folder(folder, "model.safetensors", weight_table(cfg),
                module_params(UMT5Encoder(cfg, rngs=nnx.Rngs(seed))),
                {"architectures": ["UMT5EncoderModel"], "model_type": "umt5", **config})


def write_tokenizer(folder: pathlib.Path, vocab_size: int = 200, corpus=None,
                    max_vocab: int | None = None, kind: str = "unigram") -> int:
    """A T5-style tokenizer ('</s>' appended, '<pad>' = 0) trained on ``corpus`` (default: a
    few generic lines); returns its vocabulary size. ``kind``: ``unigram`` (sub-words, like
    T5's) or ``words`` (one token per word and per punctuation mark: short sequences for a
    closed vocabulary). ``max_vocab``: the text encoder's vocabulary, not to be outgrown."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import Unigram, WordLevel

    special = ["<pad>", "</s>", "<unk>"]
    if kind == "words":
        tok = Tokenizer(WordLevel(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Punctuation()])
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=special)
    elif kind == "unigram":
        tok = Tokenizer(Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                          special_tokens=special)
    else:
        raise ValueError(f"kind={kind!r}: use 'unigram' or 'words'")
    tok.train_from_iterator(list(corpus or CORPUS) * 8, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    if max_vocab is not None and tok.get_vocab_size() > max_vocab:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, more than the text "
                           f"encoder's vocabulary of {max_vocab}")
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
         "padding_side": "right", "model_max_length": 512,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    return tok.get_vocab_size()


def build_pipeline_folder(root: pathlib.Path) -> pathlib.Path:
    """Write the whole random pipeline folder (diffusers ``WanPipeline`` layout) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    write_tokenizer(root / "tokenizer", max_vocab=UMT5["vocab_size"])
    write_text_encoder(root / "text_encoder")
    write_vae(root / "vae")
    write_transformer(root / "transformer")
    (root / "scheduler").mkdir(exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER, indent=2))
    (root / "model_index.json").write_text(json.dumps({
        "_class_name": "WanPipeline", "_diffusers_version": "0.35.0",
        "boundary_ratio": None, "expand_timesteps": False,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": [None, None],
        "vae": ["diffusers", "AutoencoderKLWan"]}, indent=2))
    return root


__all__ = ["CORPUS", "SCHEDULER", "TRANSFORMER", "UMT5", "VAE", "build_pipeline_folder",
           "write_text_encoder", "write_tokenizer", "write_transformer", "write_vae"]
