"""Loading a diffusers ``FluxPipeline`` folder: ``tokenizer/`` + ``text_encoder/`` (CLIP),
``tokenizer_2/`` + ``text_encoder_2/`` (T5), ``vae/`` (``AutoencoderKL``), ``transformer/``
(``FluxTransformer2DModel``) and ``scheduler/`` (``FlowMatchEulerDiscreteScheduler``); the
folder's ``ditax_sample.json`` (:mod:`ditax.pipelines.sample_defaults`) is read and checked
against the folder's size grid before any weights."""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from ditax.errors import ConfigError

log = logging.getLogger(__name__)

PIPELINE_CLASSES = ("FluxPipeline",)


def load_pipeline(path, dtype: str = "float32", mesh=None, attention="xla",
                  cfg_mode: str = "batched", vae_tiling: bool = False,
                  flow_shift: float | None = None, text_quantize: str = "none",
                  **model_overrides):
    """The :class:`~ditax.pipelines.flux.text_to_image.FluxTextToImage` of folder (or hub id)
    ``path``. The transformer runs ``attention`` in ``dtype`` over ``mesh``; the text
    encoders and the VAE run in ``dtype`` on one device. ``cfg_mode`` ("batched" |
    "sequential"): how true CFG runs its two branches; ``flow_shift``: a fixed shift of the
    sigmas instead of the folder's scheduler's (FLUX.1-dev: resolution-dependent);
    ``text_quantize`` ("int8" | "fp8"): the T5 encoder's block linears in 8 bits;
    ``model_overrides``: other :class:`~ditax.models.flux.config.FluxConfig` fields (e.g.
    ``remat``) and ``loras=`` (see :func:`ditax.models.flux.loading.load_transformer`).

    A folder's ``ditax_sample.json`` becomes ``pipe.sample_defaults``: the size, steps,
    guidance and text tokens a call uses where it is given none (then FLUX.1's); a LoRA's
    sampling settings (:mod:`ditax.pipelines.lora_sample`) go over it, its ``flow_shift``
    where ``flow_shift`` is None."""
    from ditax.models.encoders.clip import load_clip_text
    from ditax.models.flux.loading import load_transformer
    from ditax.models.vae.kl import load_vae
    from ditax.models.encoders.t5 import load_t5
    from ditax.pipelines.family import pipelines_of, resolve
    from ditax.pipelines.flux.text_to_image import FluxTextToImage
    from ditax.pipelines.folders import check_load_options, euler_scheduler, folder_class
    from ditax.pipelines.lora_sample import read_lora_sample

    t0 = time.perf_counter()
    check_load_options(cfg_mode, model_overrides)
    if flow_shift is not None and (isinstance(flow_shift, bool) or not isinstance(
            flow_shift, (int, float)) or not math.isfinite(flow_shift) or flow_shift <= 0):
        raise ConfigError(f"flow_shift={flow_shift!r} must be a finite number > 0 (or None: "
                          f"the folder's shift)")
    root = resolve(path)
    folder_class(root, PIPELINE_CLASSES, "FLUX.1 (text-to-image)")
    # the family's declaration by the registry (its module imports this one to load)
    defaults = pipelines_of("flux").folder_defaults(root)      # checked before any weights
    check_defaults_fit(defaults, root)
    lora_sample = read_lora_sample(pipelines_of("flux"), model_overrides.get("loras"))
    if lora_sample is not None:
        log.info("%s", lora_sample.line())
        flow_shift = lora_sample.load_args(flow_shift=flow_shift)["flow_shift"]
    scheduler = euler_scheduler(root, "FLUX.1")
    if flow_shift is not None:
        scheduler = dataclasses.replace(scheduler, shift=float(flow_shift),
                                        use_dynamic_shifting=False)
    transformer = load_transformer(root, dtype=dtype, mesh=mesh, attention=attention,
                                   **model_overrides)
    text_encoder, tokenizer = load_clip_text(root, dtype)
    text_encoder_2, tokenizer_2 = load_t5(root, dtype, text_quantize)
    vae = load_vae(root, dtype)
    check_fit(transformer.config, text_encoder, text_encoder_2, vae, root)
    pipe = FluxTextToImage(tokenizer=tokenizer, text_encoder=text_encoder,
                           tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2, vae=vae,
                           transformer=transformer, scheduler=scheduler, cfg_mode=cfg_mode,
                           vae_tiling=vae_tiling, sample_defaults=defaults)
    pipe.take_lora_sample(lora_sample)
    pipe.load_time = time.perf_counter() - t0
    return pipe


def check_fit(tc, clip, t5, vae, root) -> None:
    """The components' widths agree: T5 width = ``joint_attention_dim``, CLIP width =
    ``pooled_projection_dim``, 4 x VAE latent channels = ``in_channels``."""
    pairs = (("text_encoder_2 (T5) d_model", t5.cfg.d_model, "joint_attention_dim",
              tc.joint_attention_dim),
             ("text_encoder (CLIP) hidden_size", clip.cfg.hidden_size, "pooled_projection_dim",
              tc.pooled_projection_dim),
             ("4 x vae latent_channels", 4 * vae.latent_channels, "in_channels", tc.in_channels))
    for what, got, field, want in pairs:
        if got != want:
            raise ConfigError(f"{root}: {what} = {got} but the transformer's {field} = {want}; "
                              f"the folder mixes components of different models")


def check_defaults_fit(defaults: dict, root) -> None:
    """The sizes and text length of folder ``root``'s ``ditax_sample.json`` (``defaults``) fit
    its size grid (``vae/config.json``'s factor x the 2x2 packing) and T5's limit; else a
    :class:`~ditax.errors.PipelineLoadError` naming the file."""
    from ditax.errors import PipelineLoadError, RequestError
    from ditax.io.files import read_model_json
    from ditax.models.flux.family import vae_factor
    from ditax.models.flux.packing import PACK
    from ditax.pipelines.flux.request import MAX_TEXT_TOKENS, check_size
    from ditax.pipelines.sample_defaults import FILE

    sizes = {k: defaults[k] for k in ("height", "width") if k in defaults}
    try:
        if sizes:
            vae = read_model_json(root / "vae" / "config.json", "VAE config")
            check_size(vae_factor(vae) * PACK, **sizes)
        if defaults.get("max_sequence_length", 1) > MAX_TEXT_TOKENS:
            raise RequestError(f"max_sequence_length={defaults['max_sequence_length']} must be "
                               f"at most {MAX_TEXT_TOKENS} (T5 text tokens)")
    except RequestError as e:
        raise PipelineLoadError(f"{root / FILE}: {e}") from None


__all__ = ["PIPELINE_CLASSES", "check_defaults_fit", "check_fit", "load_pipeline"]
