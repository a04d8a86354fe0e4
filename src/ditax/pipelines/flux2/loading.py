"""Loading a diffusers ``Flux2Pipeline`` (dev) or ``Flux2KleinPipeline`` (klein) folder:
``tokenizer/`` + ``text_encoder/`` (Mistral-3 for dev, Qwen3 for klein), ``transformer/``
(``Flux2Transformer2DModel``), ``vae/`` (``AutoencoderKLFlux2``) and ``scheduler/``
(``FlowMatchEulerDiscreteScheduler``). The folder's kind (:mod:`.folder`) and its
``ditax_sample.json`` are read and checked before any weights."""

from __future__ import annotations

import time

from ditax.errors import ConfigError, PipelineLoadError, RequestError
from ditax.pipelines.flux2.request import DEV


def text_parts(kind: str):
    """``(load_model(folder, quantize, dtype), load_tokenizer(folder), embed_prompts,
    layers)`` of a folder's text encoder (:mod:`ditax.models.encoders.decoder_lm`): Mistral-3
    for dev, Qwen3 for klein; ``layers``: the hidden states the kind's pipeline reads."""
    from ditax.models.encoders import decoder_lm as lm

    if kind == DEV:
        return (lambda root, q, dt: lm.load_mistral3_text(root, q, dtype=dt),
                lm.load_mistral_tokenizer, lm.mistral3_prompt_embeds, lm.MISTRAL3_LAYERS)
    return (lambda root, q, dt: lm.load_qwen3(root, q, dtype=dt), lm.load_qwen3_tokenizer,
            lm.qwen3_prompt_embeds, lm.QWEN3_LAYERS)


def load_pipeline(path, dtype: str = "float32", mesh=None, attention="xla",
                  cfg_mode: str = "batched", vae_tiling: bool = False,
                  text_quantize: str = "none", **model_overrides):
    """The :class:`~ditax.pipelines.flux2.pipeline.Flux2ImagePipeline` of folder (or hub id)
    ``path``. The transformer runs ``attention`` in ``dtype`` over ``mesh``; the text encoder
    and the VAE run in ``dtype`` on one device (``text_quantize="int8" | "fp8"``: the text
    encoder's block linears in 8 bits). ``cfg_mode`` ("batched" | "sequential"): how klein
    base's true CFG runs its two branches; ``vae_tiling``: encode (the references) and
    decode in tiles, as diffusers' ``enable_tiling()``;
    ``model_overrides``: :class:`~ditax.models.flux2.config.Flux2Config` numerics (``remat``,
    ``quantize``...) and ``loras=`` (:func:`ditax.models.flux2.loading.load_transformer`);
    ``text_encoder_out_layers``: the text encoder's hidden states the calls read by default
    (None: the kind's, :func:`text_parts`).

    A folder's ``ditax_sample.json`` becomes ``pipe.sample_defaults``: the size, steps,
    guidance and text tokens a call uses where it is given none."""
    from ditax.models.flux2.loading import load_flux2_transformer
    from ditax.models.vae.flux2 import load_flux2_vae
    from ditax.pipelines.family import pipelines_of, resolve
    from ditax.pipelines.flux2.folder import folder_kind
    from ditax.pipelines.flux2.pipeline import Flux2ImagePipeline
    from ditax.pipelines.folders import check_load_options, euler_scheduler

    t0 = time.perf_counter()
    check_load_options(cfg_mode, model_overrides, one_transformer="a FLUX.2 folder")
    root = resolve(path)
    kind = folder_kind(root)
    defaults = pipelines_of("flux2").folder_defaults(root)      # checked before any weights
    check_defaults_fit(defaults, root, kind)
    scheduler = euler_scheduler(root, "FLUX.2")
    load_text, load_tokenizer, embed_prompts, layers = text_parts(kind)
    layers = model_overrides.pop("text_encoder_out_layers", None) or layers   # model.* key
    transformer = load_flux2_transformer(root, dtype=dtype, mesh=mesh, attention=attention,
                                         **model_overrides)
    text_encoder = load_text(root, text_quantize, dtype)
    tokenizer = load_tokenizer(root)
    vae = load_flux2_vae(root, dtype)
    check_fit(transformer.config, vae, root)
    pipe = Flux2ImagePipeline(kind=kind, tokenizer=tokenizer, text_encoder=text_encoder,
                              embed_prompts=embed_prompts, text_layers=layers, vae=vae,
                              transformer=transformer,
                              scheduler=scheduler, cfg_mode=cfg_mode, vae_tiling=vae_tiling,
                              sample_defaults=defaults)
    pipe.load_time = time.perf_counter() - t0
    return pipe


def check_fit(tc, vae, root) -> None:
    """The VAE's patchified latent channels (4 x its latent channels) are the transformer's
    ``in_channels``. (The text width against ``joint_attention_dim`` depends on the layers a
    call reads: checked per call.)"""
    got = 4 * vae.latent_channels
    if got != tc.in_channels:
        raise ConfigError(f"{root}: 4 x vae latent_channels = {got} but the transformer's "
                          f"in_channels = {tc.in_channels}; the folder mixes components of "
                          f"different models")


def check_defaults_fit(defaults: dict, root, kind: str) -> None:
    """The sizes and guidance of folder ``root``'s ``ditax_sample.json`` (``defaults``) fit its
    size grid and its kind; else a :class:`~ditax.errors.PipelineLoadError` naming the
    file."""
    from ditax.pipelines.flux2.folder import size_grid
    from ditax.pipelines.flux2.request import check_guidance, check_size
    from ditax.pipelines.sample_defaults import FILE

    try:
        sizes = {k: defaults[k] for k in ("height", "width") if k in defaults}
        if sizes:
            check_size(size_grid(root), **sizes)
        check_guidance(kind, defaults.get("guidance_scale"), None)
    except RequestError as e:
        raise PipelineLoadError(f"{root / FILE}: {e}") from None


__all__ = ["check_defaults_fit", "check_fit", "load_pipeline", "text_parts"]
