"""Loading a diffusers Wan pipeline folder into :class:`~.text_to_video.WanTextToVideo` or
:class:`~.image_to_video.WanImageToVideo` (by the folder's kind, :mod:`.folder`): the load
arguments checked before any file is read, the folder and its ``ditax_sample.json`` before any
weights, then the components (:mod:`.components`)."""

from __future__ import annotations

import logging
import time

from ditax.errors import ConfigError, check_choice
from ditax.models.common.fields import DTYPES
from ditax.phases import phase
from ditax.pipelines.family import pipelines_of
from ditax.pipelines.lora_sample import read_lora_sample
from ditax.pipelines.folders import check_load_options
from ditax.pipelines.sample_defaults import FILE as SAMPLE_FILE, read_sample_defaults
from ditax.pipelines.wan.components import load_components
from ditax.pipelines.wan.defaults import SAMPLE_DEFAULTS
from ditax.pipelines.wan.folder import ANIMATE_PIPELINE, V2V_PIPELINE, read_pipeline_folder
from ditax.pipelines.wan.image_to_video import WanImageToVideo
from ditax.pipelines.wan.request import check_load_args
from ditax.pipelines.wan.sample_defaults import check_fits
from ditax.pipelines.wan.text_to_video import WanTextToVideo
from ditax.pipelines.wan.vace import VACE_PIPELINE, WanVace
from ditax.pipelines.wan.video_to_video import WanVideoToVideo
from ditax.schedulers.overrides import check_scheduler_name

log = logging.getLogger(__name__)

#: the LoRA arguments of :func:`load_pipeline` (its ``model_overrides``), which go to the
#: transformers' loader (:func:`~ditax.pipelines.wan.components.load_components`)
LORA_KEYS = ("loras", "loras_2", "lora_strict", "lora_mode")


def load_pipeline(path, dtype: str = "float32", mesh=None, attention="xla", *,
                  cfg_mode: str = "batched", scheduler: str | None = None,
                  flow_shift: float | None = None, vae_dtype: str = "float32",
                  vae_tiling: bool | None = None, max_sequence_length: int | None = None,
                  video_to_video: bool = False, text_quantize: str = "none",
                  **model_overrides) -> "WanTextToVideo":
    """Load a diffusers Wan pipeline folder (or hub id): a text-to-video ``WanPipeline`` into
    :class:`WanTextToVideo`; a ``WanImageToVideoPipeline`` (Wan 2.1 I2V / FLF2V, Wan 2.2 I2V
    A14B) or an ``expand_timesteps`` folder (Wan 2.2 TI2V-5B) into
    :class:`~ditax.pipelines.wan.image_to_video.WanImageToVideo`, whose call takes ``image=`` /
    ``last_image=``.

    Args:
      path: folder with ``model_index.json`` and component subfolders, or a hub id (online).
      dtype: transformer, text- and image-encoder dtype ("float32" | "bfloat16" | "float16").
      mesh: optional 4-axis mesh (``ditax.make_mesh``); transformers are sharded over it.
      attention: backend name or :class:`AttentionConfig` for the transformers.
      cfg_mode: "batched" (cond + uncond in one forward of batch 2) or "sequential".
      scheduler: None = the folder's; "unipc" | "euler" = that sampler with the folder's
        ``num_train_timesteps`` and shift.
      flow_shift: override the scheduler's shift (Wan: 3.0 at 480p, 5.0 at 720p).
      vae_dtype: VAE dtype (float32 is what Wan uses; the VAE is small; bfloat16 decodes
        faster on a TPU): ``model.vae_dtype`` of a config (:class:`~ditax.models.wan.config.
        WanConfig`), so ``ditax generate ... model.vae_dtype=bfloat16``.
      vae_tiling: decode in overlapping spatial tiles (True) or whole (False); None (the
        default): whole where the VAE's estimate fits the device, else in tiles with one
        warning line (:mod:`ditax.pipelines.decode_fit`; CPUs decode whole).
      max_sequence_length: text tokens (None: the folder's ``ditax_sample.json``, else 512,
        Wan's).
      model_overrides: fields of the model config (``remat``, ...) and the LoRAs
        (:data:`LORA_KEYS`): ``loras``, merged into ``transformer`` as it loads,
        ``[(file, strength), ...]`` (any format of :mod:`ditax.lora`); ``loras_2``: the same
        for Wan 2.2's ``transformer_2`` (the low-noise expert); ``lora_strict=False`` skips
        unknown LoRA keys with a warning; ``lora_mode="unmerged"`` keeps them as run-time
        updates (see ``load_transformer``).
      text_quantize: "int8" | "fp8": the UMT5 encoder's block linears stored in 8 bits
        (:func:`ditax.models.encoders.t5.load_encoder`); "none" keeps ``dtype``.
      video_to_video: a text-to-video folder as
        :class:`~ditax.pipelines.wan.video_to_video.WanVideoToVideo` (``video=``,
        ``strength=``); another kind of folder is a :class:`ConfigError` before any weights.
        A ``WanVideoToVideoPipeline`` folder (diffusers' ``save_pretrained`` of one) loads
        as video-to-video whatever this says.

    A folder's ``ditax_sample.json`` (:mod:`ditax.pipelines.sample_defaults`) becomes
    ``pipe.sample_defaults``: the sizes, steps, guidance, ... a call uses where it is given none.
    A LoRA's sampling settings (:mod:`ditax.pipelines.lora_sample`) go over it (steps,
    guidance, sigmas), its ``scheduler`` / ``flow_shift`` where those arguments are None.
    """
    lora = {k: model_overrides.pop(k) for k in LORA_KEYS if k in model_overrides}
    check_load_options(cfg_mode, model_overrides)
    check_scheduler_name(scheduler)
    check_choice("vae_dtype", vae_dtype, DTYPES)     # model.vae_dtype: its config rule too
    check_load_args(mesh, max_sequence_length, model_overrides)   # before any file is read
    t0 = time.perf_counter()
    with phase("load"):
        folder = read_pipeline_folder(path)
        # checked before any weights; the grid against the loaded model's below
        defaults = read_sample_defaults(folder.root, pipelines_of("wan").sample_file_rules())
        lora_sample = read_lora_sample(pipelines_of("wan"), lora.get("loras"),
                                       lora.get("loras_2"))
        if lora_sample is not None:
            log.info("%s", lora_sample.line())
            scheduler, flow_shift = lora_sample.load_args(scheduler=scheduler,
                                                          flow_shift=flow_shift).values()
        video_to_video = video_to_video or folder.index.get("_class_name") == V2V_PIPELINE
        if video_to_video and (folder.kind != "t2v" or folder.index.get("_class_name")
                               not in ("WanPipeline", V2V_PIPELINE)):
            raise ConfigError(f"video-to-video needs a text-to-video folder (WanPipeline); "
                              f"{folder.root} is {folder.kind} — load a Wan T2V model")
        if max_sequence_length is None:
            max_sequence_length = {**SAMPLE_DEFAULTS, **defaults}["max_sequence_length"]
        parts = load_components(folder, dtype=dtype, mesh=mesh, attention=attention,
                                scheduler=scheduler, flow_shift=flow_shift, vae_dtype=vae_dtype,
                                text_quantize=text_quantize, **lora, **model_overrides)
        cls = WanVideoToVideo if video_to_video else WanTextToVideo
        if folder.kind != "t2v":
            cls = WanImageToVideo
            parts["expand_timesteps"] = folder.kind == "ti2v"
        if folder.index.get("_class_name") == VACE_PIPELINE:
            cls = WanVace
        if folder.index.get("_class_name") == ANIMATE_PIPELINE:
            from ditax.pipelines.wan.animate import WanAnimate

            cls = WanAnimate
        pipe = cls(**parts, boundary_ratio=folder.boundary_ratio, cfg_mode=cfg_mode,
                   vae_tiling=vae_tiling, max_sequence_length=max_sequence_length,
                   sample_defaults=defaults)
        check_fits(defaults, folder.root / SAMPLE_FILE,
                   pipe.vae.scale_factor_spatial * pipe.transformer.config.patch_size[1],
                   pipe.vae.scale_factor_temporal)
        pipe.take_lora_sample(lora_sample)
    pipe.load_time = time.perf_counter() - t0
    log.info("loaded pipeline %s in %.1fs", folder.root, pipe.load_time)
    return pipe


__all__ = ["LORA_KEYS", "load_pipeline"]
