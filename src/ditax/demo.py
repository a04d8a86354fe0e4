"""``make demo``: prompt → mp4 end to end on a fresh machine, no downloads, no torch.

Builds a small Wan text-to-video pipeline folder in ``demo_out/pipeline`` in the diffusers
layout (``model_index.json``; ``transformer/``, ``vae/``, ``text_encoder/`` as safetensors
written with ``safetensors.numpy`` through each model's conversion table in the ditax →
upstream direction; ``tokenizer/`` trained on the spot with the ``tokenizers`` library;
``scheduler/`` UniPC flow config), then runs ``ditax generate`` on it and writes
``demo_out/demo.mp4``.

The weights are RANDOM (ditax's own initialisers): the video is structured noise. What the demo
shows is the machinery: folder loading, text encoding, the jitted denoise loop with
classifier-free guidance, VAE decode, mp4 writing, and the per-phase timing line. Point
``ditax generate --model`` at a real Wan folder for real videos.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

OUT = pathlib.Path("demo_out")

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


def _float32(tree):
    """A pure parameter dict with every leaf as a float32 numpy array (what the demo saves)."""
    import numpy as np

    return {k: _float32(v) if isinstance(v, dict) else np.asarray(v, np.float32)
            for k, v in tree.items()}


def _save(folder: pathlib.Path, name: str, table, module, config: dict):
    """``module``'s parameters → upstream keys and layouts through ``table`` → safetensors."""
    from flax import nnx
    from safetensors.numpy import save_file

    from ditax.io.convert import export

    tensors = export(table, _float32(nnx.to_pure_dict(nnx.state(module, nnx.Param))))
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.copy() for k, v in tensors.items()}, str(folder / name),
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def write_transformer(folder: pathlib.Path, seed: int = 0):
    """Random Wan transformer → diffusers ``WanTransformer3DModel`` safetensors + config."""
    from ditax.config import ModelConfig
    from ditax.models.wan.convert import weight_table
    from ditax.models.wan.loading import init_model

    cfg = ModelConfig.from_diffusers(TRANSFORMER)
    _save(folder, "diffusion_pytorch_model.safetensors",
          weight_table(cfg.num_layers, cfg.cross_attn_norm), init_model(cfg, seed=seed),
          {"_class_name": "WanTransformer3DModel", **TRANSFORMER})


def write_vae(folder: pathlib.Path, seed: int = 1):
    """Random Wan VAE → diffusers ``AutoencoderKLWan`` safetensors + config."""
    from flax import nnx

    from ditax.models.wan.vae import WanVAE, WanVAEConfig
    from ditax.models.wan.vae_convert import weight_table

    vae = WanVAE(WanVAEConfig.from_diffusers(VAE), rngs=nnx.Rngs(seed))
    _save(folder, "diffusion_pytorch_model.safetensors", weight_table(vae), vae,
          {"_class_name": "AutoencoderKLWan", **VAE})


def write_text_encoder(folder: pathlib.Path, seed: int = 2):
    """Random UMT5 encoder → transformers ``UMT5EncoderModel`` safetensors + config."""
    from flax import nnx

    from ditax.models.umt5 import UMT5Config, UMT5Encoder, weight_table

    cfg = UMT5Config.from_hf(UMT5)
    _save(folder, "model.safetensors", weight_table(cfg), UMT5Encoder(cfg, rngs=nnx.Rngs(seed)),
          {"architectures": ["UMT5EncoderModel"], "model_type": "umt5", **UMT5})


def write_tokenizer(folder: pathlib.Path, vocab_size: int = 200):
    """A T5-style Unigram tokenizer ('</s>' appended, '<pad>' = 0) trained on a few lines."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import Unigram

    tok = Tokenizer(Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                      special_tokens=["<pad>", "</s>", "<unk>"])
    tok.train_from_iterator(CORPUS * 8, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    if tok.get_vocab_size() > UMT5["vocab_size"]:
        raise RuntimeError("demo tokenizer outgrew the text encoder's vocabulary")
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
         "padding_side": "right", "model_max_length": 512,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))


def build_pipeline_folder(root: pathlib.Path) -> pathlib.Path:
    """Write the whole random pipeline folder (diffusers ``WanPipeline`` layout) under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    write_tokenizer(root / "tokenizer")
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


def main(argv=None) -> int:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    from ditax.cli import main as cli

    print("ditax demo: building a small random Wan pipeline in demo_out/pipeline "
          "(diffusers folder layout, written without torch) ...")
    folder = build_pipeline_folder(OUT / "pipeline")
    argv = [
        "generate", "--model", str(folder),
        "--prompt", "a cat walks on the grass in the sun",
        "--negative-prompt", "blurry, low quality",
        "--height", "64", "--width", "96", "--frames", "9", "--steps", "8",
        "--guidance", "5.0", "--seed", "0",
        "--output", str(OUT / "demo.mp4"), "--frames-dir", str(OUT / "frames"),
        *(sys.argv[1:] if argv is None else argv),
    ]
    print("running: ditax " + " ".join(repr(a) if " " in a else a for a in argv))
    rc = cli(argv)
    if rc == 0:
        print("NOTE: the weights are RANDOM, so demo_out/demo.mp4 is noise. The demo shows the "
              "pipeline end to end (load, text, denoise, decode, mp4); use --model with a real "
              "Wan folder, e.g. Wan-AI/Wan2.1-T2V-1.3B-Diffusers, for real videos.")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
