"""FLUX.1's random pipeline folders (``ditax init-random``; the ``flux`` family's
``random_folders``): a ``FluxPipeline`` folder — the transformer at its real size, the
``AutoencoderKL`` (FLUX.1's config, or ``--vae small``: its 8x factor and 16 latent channels
at a fraction of the width), a CLIP text tower of the transformer's pooled width (CLIP-L's
block shape for 768) and a T5 encoder of its text width (T5-XXL's for 4096), each cut to
``--text-layers`` blocks and to its tokenizer's vocabulary, the shipped small Flux's CLIP and
T5 word tokenizers, and FLUX.1-dev's scheduler (the resolution-dependent shift).
"""

from __future__ import annotations

import json

from ditax.recipes.flux_parts import MODEL_INDEX
from ditax.recipes.random_folders import Folder, Preset, RandomFolders, sample_size
from ditax.recipes.random_parts import module_part

#: FLUX.1-dev's scheduler/scheduler_config.json
SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0",
             "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096,
             "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 3.0,
             "use_dynamic_shifting": True}
#: FLUX.1's vae/config.json (diffusers' AutoencoderKL)
VAE = {"_class_name": "AutoencoderKL", "in_channels": 3, "out_channels": 3,
       "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
       "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "act_fn": "silu",
       "latent_channels": 16, "norm_num_groups": 32, "sample_size": 1024,
       "scaling_factor": 0.3611, "shift_factor": 0.1159, "latents_mean": None,
       "latents_std": None, "use_quant_conv": False, "use_post_quant_conv": False,
       "mid_block_add_attention": True}
VAE_SMALL = dict(VAE, block_out_channels=[8, 16, 32, 32], layers_per_block=1, norm_num_groups=4)
#: CLIP ViT-L/14's text tower shape (FLUX.1's text_encoder), without its depth and vocabulary
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
              max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5)
INDEX = {**MODEL_INDEX, "image_encoder": [None, None], "feature_extractor": [None, None]}
PRESETS = {"flux-tiny": Preset("flux-tiny", (), "FLUX.1-dev-shaped (FluxPipeline, embedded "
                                                "guidance): 1 + 1 blocks of 2 heads x 16")}


def vae_part(latent_channels: int, kind: str):
    from flax import nnx

    from ditax.models.vae.kl import FluxVAE, FluxVAEConfig
    from ditax.models.vae.kl.convert import weight_table

    config = dict(VAE if kind == "full" else VAE_SMALL, latent_channels=latent_channels)
    cfg = FluxVAEConfig.from_diffusers(config)
    return module_part("vae", config, lambda: FluxVAE(cfg, rngs=nnx.Rngs(0)), weight_table,
                       "float32")


def clip_part(width: int, layers: int, vocab: dict, dtype: str):
    """A CLIP text tower ``width`` wide (CLIP-L's shape for 768) over the tokenizer ``vocab``."""
    from flax import nnx

    from ditax.models.encoders.clip.text import CLIPTextConfig, CLIPTextEncoder
    from ditax.models.encoders.clip.text_loading import text_weight_table

    shape = CLIP_L if width == CLIP_L["hidden_size"] else dict(
        CLIP_L, hidden_size=width, intermediate_size=2 * width,
        num_attention_heads=max(1, width // 16))
    end = vocab["<|endoftext|>"]
    config = {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model", **shape,
              "num_hidden_layers": layers, "vocab_size": len(vocab), "eos_token_id": end,
              "bos_token_id": vocab["<|startoftext|>"], "pad_token_id": end}
    cfg = CLIPTextConfig.from_hf(config)
    return module_part("text_encoder", config, lambda: CLIPTextEncoder(cfg, rngs=nnx.Rngs(0)),
                       lambda _: text_weight_table(cfg), dtype, stem="model")


def folder(cfg, options) -> Folder:
    """The random ``FluxPipeline`` folder of FLUX.1 run config ``cfg``."""
    from ditax.models.flux.packing import PACK
    from ditax.recipes.random_folders import transformer_part
    from ditax.recipes.random_tokenizers import flux_tokenizers
    from ditax.recipes.random_wan import text_part

    m = cfg.model
    layers = options.text_layers or 2
    clip_files, _, t5_files, t5_vocab = flux_tokenizers(CLIP_L["max_position_embeddings"])
    parts = [transformer_part(cfg, m.to_diffusers(), options.dtype),
             vae_part(m.in_channels // PACK ** 2, options.vae),
             clip_part(m.pooled_projection_dim, layers, json.loads(clip_files["vocab.json"]),
                       options.dtype),
             text_part(m.joint_attention_dim, layers, t5_vocab, options.dtype,
                       "text_encoder_2", "t5")]
    files = {f"tokenizer/{k}": v for k, v in clip_files.items()}
    files.update({f"tokenizer_2/{k}": v for k, v in t5_files.items()})
    files["scheduler/scheduler_config.json"] = json.dumps(SCHEDULER, indent=2)
    h, w, _ = sample_size(cfg, options.size)
    sample = dict(height=h, width=w, num_inference_steps=4,
                  guidance_scale=cfg.sample.guidance_scale,
                  max_sequence_length=cfg.sample.max_sequence_length)
    note = {"text_encoders": f"CLIP ({m.pooled_projection_dim} wide) and T5 "
                             f"({m.joint_attention_dim} wide) cut to {layers} blocks and to the "
                             f"small Flux's word tokenizers (other words are unknown)",
            "vae": "FLUX.1's VAE config" if options.vae == "full" else
                   "a small VAE with FLUX.1's factor (not its size)"}
    return Folder(dict(INDEX), parts, files, sample, note)


RANDOM = RandomFolders("flux", PRESETS, folder)

__all__ = ["PRESETS", "RANDOM", "SCHEDULER", "VAE", "clip_part", "folder", "vae_part"]
