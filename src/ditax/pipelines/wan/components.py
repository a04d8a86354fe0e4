"""Load the components of a checked pipeline folder and check that they fit together.

Tokenizer, UMT5 text encoder, VAE, sampler and one or two transformers (Wan 2.2 A14B: a
high-noise ``transformer`` and a low-noise ``transformer_2`` of the same shape); for Wan 2.1
image-to-video also the CLIP image encoder and its processor settings. The sampler
is the folder's unless the caller picks another or another shift (see
:func:`ditax.schedulers.override_config`). Mismatched components (text width, latent
channels, expert shapes) raise :class:`PipelineLoadError` before any sampling.
"""

from __future__ import annotations

from ditax.pipelines.wan.folder import PipelineFolder, PipelineLoadError


def load_sampler(folder: PipelineFolder, scheduler: str | None = None,
                 flow_shift: float | None = None):
    """The folder's sampler, or ``scheduler`` ("unipc" | "euler") / ``flow_shift`` instead."""
    from ditax.schedulers import SCHEDULERS, from_config, override_config

    cfg = override_config(folder.scheduler_config(), scheduler, flow_shift)
    if cfg.get("_class_name") not in SCHEDULERS:
        raise PipelineLoadError(f"scheduler {cfg.get('_class_name')!r} in "
                                f"{folder.components['scheduler']} is not implemented; ditax has "
                                f"{sorted(SCHEDULERS)} (or pass scheduler='unipc'|'euler')")
    return from_config(cfg)


def load_components(folder: PipelineFolder, *, dtype: str = "float32", mesh=None,
                    attention="xla", scheduler: str | None = None,
                    flow_shift: float | None = None, vae_dtype: str = "float32",
                    loras=None, loras_2=None, lora_strict: bool = True,
                    lora_mode: str = "merged", text_quantize: str = "none",
                    **model_overrides) -> dict:
    """Keyword arguments for :class:`~ditax.pipelines.wan.text_to_video.WanTextToVideo`:
    ``tokenizer``, ``text_encoder``, ``vae``, ``transformer``, ``transformer_2`` (or None),
    ``scheduler``. Transformers are sharded over ``mesh`` and run ``attention``
    (a backend name or :class:`AttentionConfig`, passed as it is: the transformer loader
    coerces and checks it); ``model_overrides`` go to both.
    ``loras`` go to ``transformer``, ``loras_2`` to ``transformer_2``, merged or unmerged
    by ``lora_mode`` (see :func:`ditax.load_transformer`)."""
    from ditax.models.encoders.tokenizer import load_tokenizer
    from ditax.models.encoders.umt5 import load_text_encoder
    from ditax.models.wan.loading import load_transformer
    from ditax.models.vae.wan.convert import load_vae

    subs = folder.components
    if loras_2 and "transformer_2" not in subs:
        raise PipelineLoadError(f"loras_2 is for Wan 2.2's low-noise expert, but {folder.root} "
                                f"has no transformer_2; pass the LoRAs as loras=")
    sched = load_sampler(folder, scheduler, flow_shift)
    tok = load_tokenizer(subs["tokenizer"])
    enc = load_text_encoder(subs["text_encoder"], dtype=dtype, quantize=text_quantize)
    vae = load_vae(subs["vae"], dtype=vae_dtype)
    tr = load_transformer(subs["transformer"], dtype=dtype, mesh=mesh, attention=attention,
                          subfolder=None, loras=loras, lora_strict=lora_strict,
                          lora_mode=lora_mode, **model_overrides)
    tr2 = None
    if "transformer_2" in subs:
        tr2 = load_transformer(subs["transformer_2"], dtype=dtype, mesh=mesh, attention=attention,
                               subfolder=None, loras=loras_2, lora_strict=lora_strict,
                               lora_mode=lora_mode, **model_overrides)
    parts = dict(tokenizer=tok, text_encoder=enc, vae=vae, transformer=tr, transformer_2=tr2,
                 scheduler=sched)
    if "image_encoder" in subs:
        from ditax.models.encoders.clip import load_image_encoder, load_image_processor

        parts["image_processor"] = load_image_processor(subs["image_processor"])
        parts["image_encoder"] = load_image_encoder(subs["image_encoder"], dtype=dtype)
    check_fit(enc, vae, tr, tr2, kind=folder.kind, image_encoder=parts.get("image_encoder"))
    return parts


def check_fit(text_encoder, vae, transformer, transformer_2=None, *, kind: str = "t2v",
              image_encoder=None) -> None:
    """Raise :class:`PipelineLoadError` when the components' shapes do not fit together
    (``kind``: the folder's, see :attr:`~ditax.pipelines.wan.folder.PipelineFolder.kind`)."""
    tc = transformer.config
    check_image_fit(vae, tc, kind, image_encoder)
    if transformer_2 is not None and transformer_2.config != tc:
        raise PipelineLoadError(f"transformer_2 config {transformer_2.config} differs from "
                                f"transformer {tc}; both experts must have the same shape")
    if text_encoder.cfg.d_model != tc.text_dim:
        raise PipelineLoadError(f"text_encoder d_model={text_encoder.cfg.d_model} != transformer "
                                f"text_dim={tc.text_dim}; the folder mixes components")
    if kind == "i2v":
        return  # channels checked by check_image_fit
    if vae.z_dim != tc.in_channels or vae.z_dim != tc.out_channels:
        raise PipelineLoadError(f"vae z_dim={vae.z_dim} != transformer in/out channels "
                                f"{tc.in_channels}/{tc.out_channels}")


def check_image_fit(vae, tc, kind: str, image_encoder) -> None:
    """The image-to-video wiring: an ``i2v`` transformer reads noise, mask (one channel per
    frame of a latent frame) and condition latents, ``in_channels = 2 z + temporal factor``;
    a CLIP encoder is there exactly when the transformer has ``image_dim``, with that width."""
    if kind == "i2v":
        want = 2 * vae.z_dim + vae.scale_factor_temporal
        if tc.in_channels != want or tc.out_channels != vae.z_dim:
            raise PipelineLoadError(
                f"image-to-video transformer in/out channels {tc.in_channels}/"
                f"{tc.out_channels} do not fit vae z_dim={vae.z_dim}: expected {want} (noise "
                f"{vae.z_dim} + mask {vae.scale_factor_temporal} + condition {vae.z_dim}) / "
                f"{vae.z_dim}; the folder mixes components")
    if kind == "t2v" and tc.image_dim is not None:
        raise PipelineLoadError(f"the transformer is an image-to-video model (image_dim="
                                f"{tc.image_dim}) in a WanPipeline folder; save it as a "
                                f"WanImageToVideoPipeline with its image encoder")
    if (image_encoder is None) != (tc.image_dim is None):
        raise PipelineLoadError(
            f"transformer image_dim={tc.image_dim} but the folder has "
            f"{'no' if image_encoder is None else 'an'} image_encoder; Wan 2.1 I2V needs its CLIP "
            f"encoder, Wan 2.2 I2V / TI2V have none")
    if image_encoder is not None and image_encoder.cfg.hidden_size != tc.image_dim:
        raise PipelineLoadError(f"image_encoder hidden_size={image_encoder.cfg.hidden_size} != "
                                f"transformer image_dim={tc.image_dim}")


__all__ = ["check_fit", "check_image_fit", "load_components", "load_sampler"]
