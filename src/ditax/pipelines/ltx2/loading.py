"""Loading a diffusers ``LTX2Pipeline`` / ``LTX2ImageToVideoPipeline`` folder: ``tokenizer/`` + ``text_encoder/`` (Gemma-3)
+ ``connectors/`` (``LTX2TextConnectors``), ``transformer/`` (``LTX2VideoTransformer3DModel``),
``vae/`` (``AutoencoderKLLTX2Video``), ``audio_vae/`` (``AutoencoderKLLTX2Audio``),
``vocoder/`` (``LTX2Vocoder`` / ``LTX2VocoderWithBWE``) and ``scheduler/``
(``FlowMatchEulerDiscreteScheduler``). The folder's ``ditax_sample.json`` is read and checked
against the folder's grid before any weights."""

from __future__ import annotations

import time

from ditax.errors import ConfigError

PIPELINE_CLASSES = ("LTX2Pipeline", "LTX2ImageToVideoPipeline")
IMAGE_TO_VIDEO = "LTX2ImageToVideoPipeline"
COMPONENTS = ("tokenizer", "text_encoder", "connectors", "transformer", "vae", "audio_vae",
              "vocoder", "scheduler")


def _factors(root) -> tuple[int, int]:
    """The video VAE's (spatial, temporal) factors, from ``vae/config.json`` (no weights)."""
    from ditax.io.files import read_model_json
    from ditax.models.vae.ltx2.config import LTX2VideoVAEConfig

    cfg = LTX2VideoVAEConfig.from_diffusers(read_model_json(root / "vae" / "config.json",
                                                            "VAE config"))
    return cfg.spatial_factor, cfg.temporal_factor


def check_folder(root) -> str:
    """``root`` is an LTX-2 pipeline folder with every component folder present; returns its
    class."""
    from ditax.pipelines.folders import folder_class, read_index

    cls = read_index(root).get("_class_name")
    if cls == "LTX2LatentUpsamplePipeline":
        raise ConfigError(f"{root} is a latent upsampler folder ({cls}), which samples nothing "
                          f"itself: give it as --upsampler (upsampler=) next to an LTX-2 "
                          f"--model folder")
    return folder_class(root, PIPELINE_CLASSES, "LTX-2", COMPONENTS)[0]


def preflight(root, load: dict, call: dict | None = None, mesh=None) -> None:
    """The folder's parts, the request's sizes on its VAE's grid, the attention backend with
    both head dims; no weights read."""
    from ditax.attention import check_available
    from ditax.models.ltx2.transformer.loading import read_config
    from ditax.pipelines.ltx2.request import check_frames, check_size

    cls = check_folder(root)
    if call is not None and cls == IMAGE_TO_VIDEO and call.get("image") is None \
            and call.get("latents") is None:
        from ditax.errors import RequestError

        raise RequestError(f"{root} is an image-to-video folder ({IMAGE_TO_VIDEO}); pass "
                           f"--image FIRST.png (image=), the video's first frame")
    if call:
        spatial, temporal = _factors(root)
        check_size(call.get("height"), call.get("width"), spatial)
        check_frames(call.get("num_frames"), temporal)
    tc = read_config(root / "transformer")
    for key, default in (("attention_head_dim", 128), ("audio_attention_head_dim", 64)):
        check_available(load["attention"], mesh=mesh, dtype=load["dtype"],
                        head_dim=tc.get(key, default))


def load_pipeline(path, dtype: str = "float32", mesh=None, attention="xla",
                  cfg_mode: str = "batched", vae_tiling: bool = False,
                  text_quantize: str = "none", **model_overrides):
    """The :class:`~ditax.pipelines.ltx2.video.LTX2Video` of folder (or hub id) ``path``
    (an ``LTX2Pipeline`` or ``LTX2ImageToVideoPipeline`` folder; the latter requires an
    image). The transformer runs ``attention`` in ``dtype`` over ``mesh``; the text encoder,
    the VAEs and the vocoder run in ``dtype`` on one device (``text_quantize="int8"``: the
    Gemma-3 weights stored in 8 bits). ``cfg_mode``: how CFG runs its two branches;
    ``vae_tiling``: decode the video in tiles (diffusers' ``enable_tiling()``);
    ``model_overrides``: :class:`~ditax.models.ltx2.config.LTX2Config` numerics (``remat``,
    ``scan_layers``...) and the transformer's LoRAs (``loras=[(file, strength)]``,
    ``lora_mode``, ``lora_strict``: :meth:`ditax.models.common.loader.TransformerLoader.load`;
    diffusers / PEFT or the original LTX-2 keys, :mod:`ditax.models.ltx2.lora_names`)."""
    from ditax.models.ltx2.audio.convert import load_audio_vae
    from ditax.models.ltx2.family import LTX2Family
    from ditax.models.ltx2.text.encoder import load_ltx2_text
    from ditax.models.ltx2.vocoder.convert import load_vocoder
    from ditax.models.vae.ltx2 import load_ltx2_video_vae
    from ditax.pipelines.family import pipelines_of, resolve
    from ditax.pipelines.folders import check_load_options, euler_scheduler
    from ditax.pipelines.ltx2.video import LTX2Video

    t0 = time.perf_counter()
    check_load_options(cfg_mode, model_overrides, one_transformer="an LTX-2 folder")
    root = resolve(path)
    cls = check_folder(root)
    defaults = pipelines_of("ltx2").folder_defaults(root)      # checked before any weights
    scheduler = euler_scheduler(root, "LTX-2")
    # the LoRA files read once: their transformer rows go to the family's loader (lora_mode=,
    # lora_strict=), their connector keys merged into the connectors (always merged: the text
    # path runs once per prompt)
    connector_loras = None
    if model_overrides.get("loras"):
        from ditax.lora import resolve_loras
        from ditax.models.ltx2.lora_names import LORA_NAMES, connector_lora

        model_overrides["loras"] = resolve_loras(
            model_overrides["loras"], model_overrides.get("lora_strict", True), names=LORA_NAMES)
        connector_loras = connector_lora(model_overrides["loras"])
    transformer = LTX2Family.load_transformer(root, dtype=dtype, mesh=mesh, attention=attention,
                                              **model_overrides)
    text = load_ltx2_text(root, dtype, quantize=text_quantize, connector_loras=connector_loras)
    vae = load_ltx2_video_vae(root, dtype)
    audio_vae = load_audio_vae(root, dtype)
    vocoder = load_vocoder(root, dtype)
    check_fit(transformer.config, vae, audio_vae, root)
    pipe = LTX2Video(text=text, transformer=transformer, vae=vae, audio_vae=audio_vae,
                     vocoder=vocoder, scheduler=scheduler, cfg_mode=cfg_mode,
                     vae_tiling=vae_tiling, sample_defaults=defaults,
                     needs_image=cls == IMAGE_TO_VIDEO)
    pipe.load_time = time.perf_counter() - t0
    return pipe


def check_fit(tc, vae, audio_vae, root) -> None:
    """The components' widths agree (a folder mixing models is one line naming both)."""
    pairs = (("vae latent_channels", vae.latent_channels, "in_channels", tc.in_channels),
             ("audio_vae latent_channels x latent mel bins",
              audio_vae.latent_channels * audio_vae.config.latent_mel_bins,
              "audio_in_channels", tc.audio_in_channels))
    for what, got, field, want in pairs:
        if got != want:
            raise ConfigError(f"{root}: {what} = {got} but the transformer's {field} = {want}; "
                              f"the folder mixes components of different models")


__all__ = ["COMPONENTS", "IMAGE_TO_VIDEO", "PIPELINE_CLASSES", "check_fit", "check_folder", "load_pipeline",
           "preflight"]
