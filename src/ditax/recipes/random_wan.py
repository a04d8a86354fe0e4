"""Wan's random pipeline folders (``ditax init-random``; the ``wan`` family's
``random_folders``): text-to-video ``WanPipeline`` (Wan 2.2 TI2V: ``expand_timesteps``, the
Wan 2.2 VAE), image-to-video ``WanImageToVideoPipeline`` (Wan 2.1 I2V with its CLIP image
encoder; Wan 2.2 I2V without), ``WanVACEPipeline`` and ``WanAnimatePipeline`` — the kind read
from the model config (VACE layers, the Animate fields, ``image_dim``, the input channels).

Beside the transformer (its real size): the Wan VAE (2.1, or 2.2 for TI2V: the real config,
or ``--vae small``: its factors at ``base_dim`` 16), a UMT5 text encoder of the transformer's
text width (umT5-XXL's block shape for 4096, a small one otherwise) cut to ``--text-layers``
blocks and to the tokenizer's vocabulary, the shipped demo's word tokenizer, for I2V and
Animate a CLIP vision tower of the transformer's ``image_dim`` (ViT-H/14's shape for 1280)
and its processor settings, and Wan 2.1's UniPC scheduler (shift 3).
"""

from __future__ import annotations

import json

from ditax.recipes.random_folders import Folder, Preset, RandomFolders, sample_size
from ditax.recipes.random_parts import module_part

#: Wan 2.1's scheduler/scheduler_config.json (diffusers' UniPC on flow sigmas, shift 3)
SCHEDULER = {"_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.33.0.dev0",
             "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
             "disable_corrector": [], "dynamic_thresholding_ratio": 0.995,
             "final_sigmas_type": "zero", "flow_shift": 3.0, "lower_order_final": True,
             "num_train_timesteps": 1000, "predict_x0": True,
             "prediction_type": "flow_prediction", "rescale_betas_zero_snr": False,
             "sample_max_value": 1.0, "solver_order": 2, "solver_p": None,
             "solver_type": "bh2", "steps_offset": 0, "thresholding": False,
             "timestep_spacing": "linspace", "trained_betas": None, "use_beta_sigmas": False,
             "use_exponential_sigmas": False, "use_flow_sigmas": True,
             "use_karras_sigmas": False}
#: Wan 2.1's vae/config.json (AutoencoderKLWan; its latent statistics are the real ones)
VAE_FULL = {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
            "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
            "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517,
                             1.5508, 0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497,
                             0.2503, -0.2921],
            "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                            3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]}
#: the same factors (8x spatial, 4x temporal) at a fraction of the cost: CPU tests
VAE_SMALL = {**VAE_FULL, "base_dim": 16, "num_res_blocks": 1}
#: the Wan 2.2 VAE's shape (TI2V-5B: residual, 2x2 pixel patches, 16x spatial); its 48
#: latent statistics are written as 0 / 1 (a random model has no real ones)
VAE22 = {"base_dim": 160, "decoder_base_dim": 256, "dim_mult": [1, 2, 4, 4],
         "num_res_blocks": 2, "attn_scales": [], "temperal_downsample": [False, True, True],
         "dropout": 0.0, "is_residual": True, "in_channels": 12, "out_channels": 12,
         "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4}
#: umT5-XXL's block shape (Wan's text encoder), without its depth and vocabulary
UMT5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_heads=64,
                relative_attention_num_buckets=32, relative_attention_max_distance=128,
                layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu")
#: Wan 2.1 I2V's image encoder (open-CLIP ViT-H/14) shape, without its depth
VIT_H14 = dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=16,
               image_size=224, patch_size=14, projection_dim=1024, hidden_act="gelu",
               layer_norm_eps=1e-5)
_ANIMATE = ("model.in_channels=36", "model.out_channels=16", "model.image_dim=32",
            "model.added_kv_proj_dim=128", "model.motion_encoder_size=16",
            'model.motion_encoder_channel_sizes=[["16", 8], ["8", 12], ["4", 8]]',
            "model.motion_style_dim=16", "model.motion_dim=4", "model.motion_encoder_dim=16",
            "model.face_encoder_hidden_dim=8", "model.face_encoder_num_heads=2",
            "model.inject_face_latents_blocks=1", "model.motion_encoder_batch_size=4")
PRESETS = {
    "tiny": Preset("tiny", (), "Wan 2.1 text-to-video (WanPipeline): 2 blocks of 4 heads x 32"),
    "i2v-tiny": Preset("tiny", ("model.in_channels=36", "model.out_channels=16",
                                "model.image_dim=32", "model.added_kv_proj_dim=128"),
                       "Wan 2.1 image-to-video (WanImageToVideoPipeline, CLIP image encoder)"),
    "ti2v-tiny": Preset("tiny", ("model.vae=wan2.2", "model.expand_timesteps=true"),
                        "Wan 2.2 text-image-to-video (expand_timesteps, the Wan 2.2 VAE)"),
    "vace-tiny": Preset("tiny", ("model.vace_layers=[0,1]", "model.vace_in_channels=96"),
                        "Wan VACE (WanVACEPipeline): control video, mask, reference images"),
    "animate-tiny": Preset("tiny", _ANIMATE, "Wan 2.2 Animate (WanAnimatePipeline): image + "
                                             "pose and face videos, a 16 px motion encoder"),
}


def _index(cls: str, m, image: bool) -> dict:
    """``model_index.json`` of a ``cls`` folder (diffusers' component entries)."""
    transformer = {"WanVACEPipeline": "WanVACETransformer3DModel",
                   "WanAnimatePipeline": "WanAnimateTransformer3DModel"}.get(
        cls, "WanTransformer3DModel")
    out = {"_class_name": cls, "_diffusers_version": "0.35.0",
           "scheduler": ["diffusers", "UniPCMultistepScheduler"],
           "text_encoder": ["transformers", "UMT5EncoderModel"],
           "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
           "transformer": ["diffusers", transformer], "vae": ["diffusers", "AutoencoderKLWan"]}
    if image:
        out.update(image_encoder=["transformers", "CLIPVisionModel"],
                   image_processor=["transformers", "CLIPImageProcessor"])
    if cls in ("WanPipeline", "WanImageToVideoPipeline"):
        out.update(boundary_ratio=None, expand_timesteps=bool(m.expand_timesteps),
                   transformer_2=[None, None])
        if cls == "WanImageToVideoPipeline" and not image:
            out.update(image_encoder=[None, None], image_processor=[None, None])
    if cls == "WanVACEPipeline":
        out.update(boundary_ratio=None, transformer_2=[None, None])
    return out


def folder_kind(m) -> tuple[str, bool]:
    """``(pipeline class, has a CLIP image encoder)`` of Wan model config ``m``."""
    from ditax.models.wan.animate import WanAnimateConfig

    if isinstance(m, WanAnimateConfig):
        return "WanAnimatePipeline", True
    if m.vace_layers:
        return "WanVACEPipeline", False
    if m.image_condition == "channels":
        return "WanImageToVideoPipeline", m.image_dim is not None
    return "WanPipeline", False


def vae_part(m, kind: str):
    """The Wan VAE of model ``m`` (2.1, or 2.2 for ``model.vae=wan2.2``): ``kind`` ``full``
    (the real shape) or ``small``."""
    from flax import nnx

    from ditax.models.vae.wan import WanVAE, WanVAEConfig
    from ditax.models.vae.wan.convert import weight_table

    if m.vae == "wan2.2":
        z = m.out_channels
        config = {**VAE22, "z_dim": z, "latents_mean": [0.0] * z, "latents_std": [1.0] * z}
        if kind == "small":
            config.update(base_dim=16, decoder_base_dim=24, num_res_blocks=1)
    else:
        config = dict(VAE_FULL if kind == "full" else VAE_SMALL)
    config = {"_class_name": "AutoencoderKLWan", **config}
    cfg = WanVAEConfig.from_diffusers(config)
    return module_part("vae", config, lambda: WanVAE(cfg, rngs=nnx.Rngs(0)), weight_table,
                       "float32")


def text_config(text_dim: int, layers: int, vocab: int, model: str = "umt5") -> dict:
    """A transformers ``UMT5EncoderModel`` (``model="t5"``: ``T5EncoderModel``, FLUX.1's T5)
    config: umT5-XXL's (T5-XXL's) block shape when the transformer reads 4096-wide text, else
    a small one of ``text_dim`` (the tiny presets)."""
    shape = UMT5_XXL if text_dim == UMT5_XXL["d_model"] else dict(
        UMT5_XXL, d_model=text_dim, d_kv=16, d_ff=2 * text_dim, num_heads=max(1, text_dim // 16))
    arch = "UMT5EncoderModel" if model == "umt5" else "T5EncoderModel"
    return {"architectures": [arch], "model_type": model, **shape,
            "num_layers": layers, "vocab_size": vocab, "dense_act_fn": "gelu_new",
            "is_gated_act": True, "tie_word_embeddings": False}


def text_part(text_dim: int, layers: int, vocab: int, dtype: str, name: str = "text_encoder",
              model: str = "umt5"):
    """The (U)T5 encoder of :func:`text_config` as the weight folder ``name``."""
    from flax import nnx

    from ditax.models.encoders.t5 import T5Config, T5Encoder, weight_table
    from ditax.models.encoders.umt5 import UMT5Config, UMT5Encoder

    config = text_config(text_dim, layers, vocab, model)
    cls, module = (UMT5Config, UMT5Encoder) if model == "umt5" else (T5Config, T5Encoder)
    cfg = cls.from_hf(config)
    return module_part(name, config, lambda: module(cfg, rngs=nnx.Rngs(0)),
                       lambda _: weight_table(cfg), dtype, stem="model")


def image_parts(image_dim: int, layers: int, dtype: str):
    """``(image_encoder part, image_processor files)``: a CLIP vision tower of ``image_dim``
    (ViT-H/14's shape for 1280, else 32 px images of 8 px patches) cut to ``layers``."""
    from flax import nnx

    from ditax.models.encoders.clip.encoder import CLIPVisionConfig, CLIPVisionEncoder
    from ditax.models.encoders.clip.loading import weight_table

    shape = VIT_H14 if image_dim == VIT_H14["hidden_size"] else dict(
        VIT_H14, hidden_size=image_dim, intermediate_size=2 * image_dim, image_size=32,
        patch_size=8, projection_dim=16, num_attention_heads=max(1, image_dim // 8))
    config = {"architectures": ["CLIPVisionModel"], "model_type": "clip_vision_model", **shape,
              "num_hidden_layers": max(2, layers), "num_channels": 3}
    cfg = CLIPVisionConfig.from_hf(config)
    part = module_part("image_encoder", config,
                       lambda: CLIPVisionEncoder(cfg, rngs=nnx.Rngs(0)),
                       lambda _: weight_table(cfg), dtype, stem="model")
    s = shape["image_size"]
    processor = {"image_processor_type": "CLIPImageProcessor", "do_convert_rgb": True,
                 "do_resize": True, "size": {"shortest_edge": s}, "resample": 3,
                 "do_center_crop": True, "crop_size": {"height": s, "width": s},
                 "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                 "image_mean": [0.48145466, 0.4578275, 0.40821073],
                 "image_std": [0.26862954, 0.26130258, 0.27577711]}
    return part, {"image_processor/preprocessor_config.json": json.dumps(processor, indent=2)}


def folder(cfg, options) -> Folder:
    """The random folder of Wan run config ``cfg`` (module docstring)."""
    from ditax.models.wan.vace import vace_config
    from ditax.recipes.random_folders import transformer_part
    from ditax.recipes.random_tokenizers import wan_tokenizer

    m = cfg.model
    cls, image = folder_kind(m)
    config = vace_config(m).to_diffusers() if m.vace_layers else m.to_diffusers()
    layers = options.text_layers or 2
    tokenizer, vocab = wan_tokenizer()
    parts = [transformer_part(cfg, config, options.dtype), vae_part(m, options.vae),
             text_part(m.text_dim, layers, vocab, options.dtype)]
    files = {f"tokenizer/{k}": v for k, v in tokenizer.items()}
    files["scheduler/scheduler_config.json"] = json.dumps(SCHEDULER, indent=2)
    if image:
        part, processor = image_parts(m.image_dim, layers, options.dtype)
        parts.append(part)
        files.update(processor)
    h, w, f = sample_size(cfg, options.size)
    sample = dict(height=h, width=w, num_frames=f, num_inference_steps=4, guidance_scale=1.0,
                  negative_prompt="", max_sequence_length=cfg.sample.max_sequence_length)
    te = parts[2].config
    note = {"text_encoder": f"UMT5 cut to {te['num_layers']} of umT5-XXL's 24 blocks and to "
                            f"the tokenizer's {te['vocab_size']} tokens (of 256,384); width "
                            f"{te['d_model']} as the transformer reads",
            "tokenizer": "the ditax demo model's word tokenizer (other words are <unk>); "
                         "prompts are padded to max_sequence_length as Wan's",
            "vae": f"the Wan {'2.2' if m.vae == 'wan2.2' else '2.1'} VAE's config"
                   if options.vae == "full" else "a small VAE with the Wan VAE's factors "
                                                  "(not its size)"}
    if image:
        note["image_encoder"] = (f"a CLIP vision tower {m.image_dim} wide cut to "
                                 f"{parts[-1].config['num_hidden_layers']} layers")
    return Folder(_index(cls, m, image), parts, files, sample, note)


RANDOM = RandomFolders("wan", PRESETS, folder)

__all__ = ["PRESETS", "RANDOM", "SCHEDULER", "UMT5_XXL", "VAE_FULL", "VAE_SMALL", "folder",
           "folder_kind", "image_parts", "text_config", "text_part", "vae_part"]
