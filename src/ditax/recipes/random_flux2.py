"""FLUX.2's random pipeline folders (``ditax init-random``; the ``flux2`` family's
``random_folders``): ``Flux2KleinPipeline`` (klein: no guidance embedding, a Qwen3 text
encoder; written step-distilled, run without CFG) or ``Flux2Pipeline`` (dev: embedded guidance,
a Mistral-3 text encoder) — the kind read from the config's ``guidance_embeds``.

Beside the transformer (its real size): the ``AutoencoderKLFlux2`` (FLUX.2's config, or
``--vae small``: its 8x factor at a fraction of the width), the text encoder of a third of the
transformer's ``joint_attention_dim`` (FLUX.2 stacks three of its hidden states) and as deep
as the layers the pipeline reads (klein 9, 18, 27; dev 10, 20, 30: 27 / 30 layers, or
``--text-layers``), its blocks narrow (a small MLP, two heads) at any width, a byte-level BPE
tokenizer with the model's chat template (:mod:`ditax.recipes.random_tokenizers`), and
FLUX.2's scheduler.
"""

from __future__ import annotations

import json

from ditax.errors import ConfigError
from ditax.recipes.random_folders import Folder, Preset, RandomFolders, sample_size
from ditax.recipes.random_parts import decoder_lm_part, module_part

#: FLUX.2's scheduler/scheduler_config.json (the shift from the image's token count)
SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.36.0",
             "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096,
             "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 3.0,
             "time_shift_type": "exponential", "use_dynamic_shifting": True}
#: FLUX.2's vae/config.json (diffusers' AutoencoderKLFlux2)
VAE = {"_class_name": "AutoencoderKLFlux2", "in_channels": 3, "out_channels": 3,
       "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
       "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "act_fn": "silu",
       "latent_channels": 32, "norm_num_groups": 32, "sample_size": 1024,
       "use_quant_conv": True, "use_post_quant_conv": True, "mid_block_add_attention": True,
       "batch_norm_eps": 1e-4, "batch_norm_momentum": 0.1, "patch_size": [2, 2]}
VAE_SMALL = dict(VAE, block_out_channels=[8, 16, 32, 32], layers_per_block=1, norm_num_groups=4)
_SMALL = ("model.joint_attention_dim=48",)      # three 16-wide hidden states
PRESETS = {
    "flux2-tiny": Preset("flux2-tiny", _SMALL, "FLUX.2 klein-shaped (Flux2KleinPipeline, "
                                               "distilled; Qwen3 27 x 16): 2 + 2 blocks"),
    "flux2-dev-tiny": Preset("flux2-tiny", (*_SMALL, "model.guidance_embeds=true"),
                             "FLUX.2 dev-shaped (Flux2Pipeline, embedded guidance; "
                             "Mistral-3 30 x 16): 2 + 2 blocks"),
}
KLEIN, DEV = ("Flux2KleinPipeline", "Qwen3ForCausalLM"), ("Flux2Pipeline",
                                                          "Mistral3ForConditionalGeneration")


def vae_part(latent_channels: int, kind: str):
    from flax import nnx

    from ditax.models.vae.flux2 import Flux2VAE, Flux2VAEConfig
    from ditax.models.vae.flux2.convert import weight_table

    config = dict(VAE if kind == "full" else VAE_SMALL, latent_channels=latent_channels)
    cfg = Flux2VAEConfig.from_diffusers(config)
    return module_part("vae", config, lambda: Flux2VAE(cfg, rngs=nnx.Rngs(0)), weight_table,
                       "float32")


def text_shape(width: int, layers: int, vocab: int) -> dict:
    """A Llama-style text block ``width`` wide, narrow at any width: two query heads (one
    key-value head) of 64 channels (16 below 128), an MLP twice the width."""
    head = 64 if width >= 128 else 16
    return dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                num_attention_heads=2, num_key_value_heads=1, head_dim=head,
                vocab_size=vocab, hidden_act="silu", rms_norm_eps=1e-6,
                max_position_embeddings=40960)


def text_part(dev: bool, width: int, layers: int, vocab: int, dtype: str):
    """The klein Qwen3 (``Qwen3ForCausalLM``: the stack under ``model.``) or dev Mistral-3
    (``Mistral3ForConditionalGeneration``: under ``language_model.model.``; its Pixtral
    tower is not written: ditax does not read it) text encoder."""
    from ditax.models.encoders.decoder_lm.mistral import mistral_config
    from ditax.models.encoders.decoder_lm.qwen3 import qwen3_config

    shape = text_shape(width, layers, vocab)
    if dev:
        config = {"architectures": [DEV[1]], "model_type": "mistral3", "image_token_index": 10,
                  "text_config": {"model_type": "mistral", **shape, "rope_theta": 1e9,
                                  "sliding_window": None}}
        return decoder_lm_part(config, mistral_config(config), "language_model.model.", dtype)
    config = {"architectures": [KLEIN[1]], "model_type": "qwen3", **shape,
              "rope_theta": 1_000_000.0, "tie_word_embeddings": True}
    return decoder_lm_part(config, qwen3_config(config), "model.", dtype)


def folder(cfg, options) -> Folder:
    """The random FLUX.2 folder of run config ``cfg`` (module docstring)."""
    from ditax.models.encoders.decoder_lm.flux2_text import MISTRAL3_LAYERS, QWEN3_LAYERS
    from ditax.recipes.random_folders import transformer_part
    from ditax.recipes.random_tokenizers import mistral_tokenizer, qwen3_tokenizer

    m = cfg.model
    dev = bool(m.guidance_embeds)
    read = MISTRAL3_LAYERS if dev else QWEN3_LAYERS
    if m.joint_attention_dim % len(read):
        raise ConfigError(f"model.joint_attention_dim={m.joint_attention_dim}: FLUX.2 stacks "
                          f"{len(read)} hidden states of its text encoder, so it must be a "
                          f"multiple of {len(read)}; e.g. model.joint_attention_dim="
                          f"{len(read) * max(1, m.joint_attention_dim // len(read))}")
    width = m.joint_attention_dim // len(read)
    layers = options.text_layers or max(read)
    if layers < max(read):
        raise ConfigError(f"--text-layers {layers}: FLUX.2 {'dev' if dev else 'klein'} reads "
                          f"the text encoder's hidden states {read}; give at least {max(read)}")
    tokenizer, vocab = (mistral_tokenizer if dev else qwen3_tokenizer)()
    parts = [transformer_part(cfg, m.to_diffusers(), options.dtype),
             vae_part(m.in_channels // 4, options.vae),
             text_part(dev, width, layers, vocab, options.dtype)]
    files = {f"tokenizer/{k}": v for k, v in tokenizer.items()}
    files["scheduler/scheduler_config.json"] = json.dumps(SCHEDULER, indent=2)
    cls, text_cls = DEV if dev else KLEIN
    index = {"_class_name": cls, "_diffusers_version": "0.36.0",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", text_cls],
             "tokenizer": ["transformers", "PixtralProcessor" if dev else "Qwen2Tokenizer"],
             "transformer": ["diffusers", "Flux2Transformer2DModel"],
             "vae": ["diffusers", "AutoencoderKLFlux2"]}
    if not dev:
        index["is_distilled"] = True
    h, w, _ = sample_size(cfg, options.size)
    # dev's prompts follow a ~110-token system message
    sample = dict(height=h, width=w, num_inference_steps=4,
                  max_sequence_length=192 if dev else 32)
    if dev:
        sample["guidance_scale"] = 4.0
    note = {"text_encoder": f"{'Mistral-3' if dev else 'Qwen3'} {width} wide (a third of "
                            f"joint_attention_dim) with {layers} narrow layers (two heads, an "
                            f"MLP of twice the width), over a {vocab}-token byte-level BPE",
            "vae": "FLUX.2's VAE config" if options.vae == "full" else
                   "a small VAE with FLUX.2's factor (not its size)"}
    return Folder(index, parts, files, sample, note)


RANDOM = RandomFolders("flux2", PRESETS, folder)

__all__ = ["PRESETS", "RANDOM", "SCHEDULER", "VAE", "folder", "text_part", "text_shape",
           "vae_part"]
