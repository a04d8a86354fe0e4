"""Tiny random diffusers ``FluxTransformer2DModel`` models and inputs for parity tests."""

from __future__ import annotations

import numpy as np

#: diffusers' own test config of FluxTransformer2DModel: 2 heads x 16, one block of each kind
TINY = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
            pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
#: a larger one: guidance embedding (FLUX.1-dev's), two blocks of each kind, 8 output channels
DEV = dict(TINY, num_layers=2, num_single_layers=2, guidance_embeds=True, in_channels=8,
           out_channels=6)


def make_diffusers_flux(tmp_path, seed: int = 0, name: str | None = None, **config):
    """A random ``FluxTransformer2DModel`` (every tensor random, norm gains near 1) saved with
    save_pretrained; returns (model, folder)."""
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    m = FluxTransformer2DModel(**config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for key, p in m.named_parameters():
            gain = 1.0 if ".norm" in key and p.ndim == 1 else 0.0
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / max(1, p.shape[-1]) ** 0.5) + gain)
    folder = tmp_path / (name or f"flux_{seed}_{config.get('num_attention_heads')}"
                                 f"_{config.get('num_layers')}")
    m.save_pretrained(folder)
    return m, folder


def flux_inputs(rng, config: dict, b: int = 2, image: int = 16, text: int = 7,
                guidance: bool = False) -> dict:
    """Random inputs in diffusers' keyword names: packed tokens, text, pooled, t in [0, 1],
    position ids (floats, as diffusers' tests use) and guidance when the model embeds it."""
    f32 = np.float32
    out = dict(hidden_states=rng.standard_normal((b, image, config["in_channels"])).astype(f32),
               encoder_hidden_states=rng.standard_normal(
                   (b, text, config["joint_attention_dim"])).astype(f32),
               pooled_projections=rng.standard_normal(
                   (b, config["pooled_projection_dim"])).astype(f32),
               timestep=rng.uniform(0, 1, b).astype(f32),
               img_ids=(rng.standard_normal((image, 3)) * 4).astype(f32),
               txt_ids=rng.standard_normal((text, 3)).astype(f32))
    if guidance:
        # the model embeds 1000 x guidance as a float32 sinusoid; jax's and torch's float32
        # frequency tables differ by an ulp in a few entries, which at g = 5 (5000 rad) is
        # ~1e-5 in the guidance embedder's gradient: scales up to 2 keep the comparison at
        # the float32 level of the rest of the model
        out["guidance"] = rng.uniform(0.5, 2.0, b).astype(f32)
    return out


def run_diffusers_flux(m, inputs: dict) -> np.ndarray:
    import torch

    with torch.no_grad():
        return m(**{k: torch.from_numpy(v) for k, v in inputs.items()},
                 return_dict=False)[0].numpy()



def _clip_tokenizer_folder(folder):
    """A character-level CLIP tokenizer (byte-level alphabet, its word-final forms, no merges;
    start / end tokens last) written as FLUX.1's ``tokenizer/``: vocab.json + merges.txt."""
    import json

    from tokenizers import pre_tokenizers

    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    words = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True)
    (folder / "vocab.json").write_text(json.dumps({w: i for i, w in enumerate(words)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    import transformers

    tok = transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"),
                                     model_max_length=77)
    return tok, len(words)


def make_tiny_flux_pipeline(tmp_path, *, guidance_embeds: bool, seed: int = 0):
    """A tiny diffusers ``FluxPipeline`` (the transformer of :data:`TINY`, dev-style with a
    guidance embedding and a dynamic-shift scheduler, or schnell-style without either), a
    two-level AutoencoderKL with 1 latent channel, tiny CLIP and T5 text towers and their
    tokenizers; saved with ``save_pretrained``. Returns ``(pipe, folder)``."""
    import torch
    import transformers
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from flux_vae_reference import CONFIGS, make_autoencoder_kl
    from pipeline_reference import _randomize, train_tokenizer

    name = "dev" if guidance_embeds else "schnell"
    tr, _ = make_diffusers_flux(tmp_path, seed, f"_tr_{name}", **TINY,
                                guidance_embeds=guidance_embeds)
    vae = make_autoencoder_kl(dict(CONFIGS["flux"], latent_channels=1), seed + 1)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(0.3)   # keep most pixels inside [-1, 1]
    tok, n_vocab = _clip_tokenizer_folder(tmp_path / f"_clip_tok_{name}")
    torch.manual_seed(seed + 2)
    clip = transformers.CLIPTextModel(transformers.CLIPTextConfig(
        vocab_size=n_vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, bos_token_id=n_vocab - 2,
        eos_token_id=2)).eval()   # 2: transformers' legacy rule, the end token = the largest id
    tok_2 = train_tokenizer(tmp_path / f"_t5_tok_{name}")
    t5 = _randomize(transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu", dropout_rate=0.0)), seed + 3)
    sched = (FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True,
                                             base_shift=0.5, max_shift=1.15)
             if guidance_embeds else FlowMatchEulerDiscreteScheduler(shift=1.0))
    pipe = FluxPipeline(scheduler=sched, vae=vae, text_encoder=clip, tokenizer=tok,
                        text_encoder_2=t5, tokenizer_2=tok_2, transformer=tr)
    pipe.set_progress_bar_config(disable=True)
    folder = tmp_path / f"flux_{name}"
    pipe.save_pretrained(folder)
    return pipe, folder
