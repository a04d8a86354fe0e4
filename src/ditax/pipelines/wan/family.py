"""Wan's pipelines as the shared entry points see them (:class:`~ditax.pipelines.family.PipelineFamily`):
its sample defaults and presets (:mod:`.defaults`), a folder's ``ditax_sample.json`` over them,
the request checks, the checks of a folder against a request before any weights, and loading."""

from __future__ import annotations

import pathlib

from ditax.errors import RequestError
from ditax.pipelines.family import PipelineFamily
from ditax.intmath import INT_LIMIT
from ditax.pipelines.request import Field
from ditax.pipelines.wan.defaults import SAMPLE_DEFAULTS, SAMPLE_PRESETS
from ditax.pipelines.wan.request_inputs import INPUTS

# Wan's own request fields, beside the common ones (ditax.pipelines.request.COMMON)
FIELDS = (
    Field("num_frames", "int", "video frames, 4k+1 (default: the folder's, else 81)",
          minimum=1, maximum=INT_LIMIT - 1, flag="--frames", limit="max_frames", example=81),
    Field("guidance_scale_2", "float", "the low-noise expert's CFG scale (Wan 2.2 two-expert "
          "folders; default: --guidance)", optional=True, minimum=0.0, flag="--guidance-2",
          example=3.0),
)
# the request's names Wan reads beyond its fields: its inputs (.request_inputs.INPUTS) and the
# video's output options
CLI_INPUTS = ("image", "last_image", "video", "strength", "mask", "reference_image",
              "conditioning_scale", "lora_2", "frames_dir", "fps", "pose_video", "face_video",
              "mode", "background_video", "mask_video", "segment_frame_length",
              "prev_segment_frames")


class WanPipelines(PipelineFamily):
    """Wan 2.1 / 2.2 T2V, I2V / FLF2V and TI2V folders (``WanPipeline``,
    ``WanImageToVideoPipeline``)."""

    name = "wan"
    parallel_vae = True        # vae_parallel=True: ditax.models.vae.parallel
    sample_defaults = SAMPLE_DEFAULTS
    sample_presets = SAMPLE_PRESETS
    fields = FIELDS
    cli_inputs = CLI_INPUTS
    inputs = INPUTS
    # a few-step student's schedule (ditax.pipelines.lora_sample)
    lora_sample_keys = ("num_inference_steps", "guidance_scale", "scheduler", "flow_shift",
                        "sigmas")

    def folder_defaults(self, root) -> dict:
        """The folder's ``ditax_sample.json`` (:mod:`ditax.pipelines.sample_defaults`), its
        sizes checked against Wan's grid here (the loaded model's own as it loads)."""
        from ditax.pipelines.sample_defaults import FILE
        from ditax.pipelines.wan.request import SPATIAL, TEMPORAL
        from ditax.pipelines.wan.sample_defaults import check_fits

        own = super().folder_defaults(root)
        if own:
            check_fits(own, pathlib.Path(root) / FILE, SPATIAL, TEMPORAL)
        return own

    def read_inputs(self, given, call: dict, sample) -> dict:
        from ditax.pipelines.wan.request_inputs import read

        return read(given, call, sample, self.check_request)

    def sample_options(self, given, sample, chosen, defaults, call):
        """The call's ``sigmas``; the loader's flow shift, text length, sampler (when chosen),
        the low-noise expert's LoRAs (``--lora-2``) and video-to-video (``--strength``)."""
        from ditax.pipelines.wan.request_inputs import read_loras_2

        load = dict(flow_shift=sample.flow_shift,
                    max_sequence_length=defaults["max_sequence_length"],
                    scheduler=sample.scheduler if "scheduler" in chosen else None,
                    loras_2=read_loras_2(given, self.name))
        if "strength" in call:
            load["video_to_video"] = True
        animate = "pose_video" in call     # Animate's segments run its own schedule (no sigmas)
        own = {} if animate else {"sigmas": sample.sigmas}
        if defaults.get("context_chunks") is not None:     # a causal student's KV cache
            own["context_chunks"] = defaults["context_chunks"]
        return own, load

    def check_request(self, prompt, height, width, num_frames, num_inference_steps,
                      guidance_scale, guidance_scale_2=None, negative_prompt=None,
                      seed=0) -> None:
        from ditax.pipelines.wan.request import check_request

        check_request(prompt, height, width, num_frames, num_inference_steps, guidance_scale,
                      guidance_scale_2, negative_prompt, seed=seed)

    def preflight(self, root, load: dict, call: dict | None = None, mesh=None) -> None:
        """The folder names a transformer (:class:`~ditax.errors.ModelNotFound` otherwise),
        takes the request's images and its latent grid fits the RoPE table (``call``;
        :class:`RequestError`), and the attention backend can run here with its head dim
        (:class:`~ditax.errors.AttentionUnavailable`)."""
        from ditax.attention import check_available
        from ditax.io.files import read_model_json
        from ditax.io.hub import resolve_folder
        from ditax.models.wan.loading import read_config

        root = pathlib.Path(root)
        if call is not None:
            check_images_fit(root, read_model_json(root / "model_index.json",
                                                   "model_index.json"), call)
        tc = read_config(resolve_folder(root, "transformer"))
        if call is not None:        # the latent grid against the folder's RoPE table
            from ditax.models.vae.wan.config import WanVAEConfig
            from ditax.pipelines.wan.causal import check_call
            from ditax.pipelines.wan.request import check_grid

            vae = WanVAEConfig.from_diffusers(read_model_json(
                resolve_folder(root, "vae") / "config.json", "VAE config"))
            patch = tuple(load.get("patch_size") or tc.get("patch_size", (1, 2, 2)))
            rope = load.get("rope_max_seq_len") or tc.get("rope_max_seq_len", 1024)
            frames = call.get("num_frames") or (    # Animate: a segment after the reference
                call.get("segment_frame_length", 77) + vae.temporal_factor)
            check_grid(call["height"], call["width"], frames, rope,
                       vae.spatial_factor * patch[1], vae.temporal_factor, patch[0])
            check_call(root, load.get("causal_chunk", tc.get("causal_chunk")), call,
                       vae.temporal_factor)
        head_dim = load.get("attention_head_dim") or tc["attention_head_dim"]
        check_available(load["attention"], mesh=mesh, dtype=load["dtype"], head_dim=head_dim)

    def load(self, path, **kwargs):
        from ditax.pipelines.wan.loading import load_pipeline

        return load_pipeline(path, **kwargs)


def check_images_fit(root, index: dict, call: dict) -> None:
    """The folder's kind (``model_index.json`` ``index``) wants the images given: a
    text-to-video folder takes none, an image-to-video folder needs ``--image``; ``--guidance-2``
    needs a two-expert folder (``boundary_ratio``)."""
    from ditax.models.wan.conditioning import folder_kind

    if check_animate_fits(root, index, call):
        return
    kind = folder_kind(index)
    given = "image" in call
    check_control_fits(root, index, call)
    if given and kind == "t2v":
        raise RequestError(f"--image given but {root} is a text-to-video folder (WanPipeline); "
                           f"drop --image or use an image-to-video model (Wan2.1-I2V-*, "
                           f"Wan2.2-I2V-A14B, Wan2.2-TI2V-5B)")
    if kind == "i2v" and not given:
        raise RequestError(f"{root} is an image-to-video folder (WanImageToVideoPipeline); pass "
                           f"the first frame with --image FIRST.png")
    if "last_image" in call and kind == "ti2v":
        raise RequestError("--last-image is not supported by Wan 2.2 TI2V (expand_timesteps "
                           "conditions the first frame only); drop it")
    check_source_video_fits(root, index, call)
    if call.get("guidance_scale_2") is not None and index.get("boundary_ratio") is None:
        raise RequestError(f"--guidance-2 is the low-noise expert's scale, but {root} is a "
                           f"one-expert folder (no boundary_ratio in model_index.json); drop "
                           f"--guidance-2 and set --guidance only")


def check_animate_fits(root, index: dict, call: dict) -> bool:
    """Whether the folder is Wan Animate (``WanAnimatePipeline``); there the call has
    ``pose_video`` and ``face_video`` and no other folder's inputs, elsewhere no Animate input
    (:class:`RequestError` in one line)."""
    cls = index.get("_class_name")
    animate = [k for k in ("pose_video", "face_video", "mode", "background_video", "mask_video",
                           "segment_frame_length", "prev_segment_conditioning_frames")
               if k in call]
    flag = lambda k: "--" + k.replace("_conditioning", "").replace("_", "-")  # noqa: E731
    if cls != "WanAnimatePipeline":
        if animate:
            raise RequestError(f"{flag(animate[0])} is a Wan Animate input, but {root} is a "
                               f"{cls} folder; drop it or use an Animate model (a "
                               f"WanAnimatePipeline folder, e.g. Wan-AI/Wan2.2-Animate-14B-"
                               f"Diffusers)")
        return False
    for key in ("pose_video", "face_video", "image"):
        if key not in call:
            raise RequestError(f"{root} is a Wan Animate folder; it needs {flag(key)} "
                               f"(--image REF.png --pose-video POSE.mp4 --face-video FACE.mp4)")
    other = [k for k in ("last_image", "video", "strength", "mask", "reference_images",
                         "conditioning_scale") if k in call]
    if other:
        raise RequestError(f"{flag(other[0]).replace('-images', '-image')} is not a Wan Animate "
                           f"input ({root}); drop it (replace mode: --mode replace "
                           f"--background-video BG.mp4 --mask-video MASK.mp4)")
    return True


def check_source_video_fits(root, index: dict, call: dict) -> None:
    """``--strength`` (video-to-video) needs a plain text-to-video folder (``WanPipeline``)
    and keeps at least one step; ``--video`` without it is a VACE folder's control video. A
    ``WanVideoToVideoPipeline`` folder needs ``--video`` (``--strength``: diffusers' 0.8)."""
    from ditax.pipelines.wan.folder import V2V_PIPELINE

    cls = index.get("_class_name")
    if cls == V2V_PIPELINE and "video" not in call:
        raise RequestError(f"{root} is a video-to-video folder ({V2V_PIPELINE}); pass the "
                           f"source with --video IN.mp4 (and --strength S, 0 < S <= 1; 0.8)")
    if "strength" in call:
        from ditax.models.wan.conditioning import folder_kind
        from ditax.pipelines.wan.video_to_video import start_step

        if cls not in ("WanPipeline", V2V_PIPELINE) or folder_kind(index) != "t2v":
            raise RequestError(f"--strength is video-to-video, which runs on a Wan "
                               f"text-to-video folder (WanPipeline); {root} is a {cls} "
                               f"({folder_kind(index)}) — drop --strength or use a T2V model")
        start_step(call["num_inference_steps"], call["strength"])
    elif "video" in call and cls not in ("WanVACEPipeline", V2V_PIPELINE):
        raise RequestError(f"--video on {root} ({cls}) is video-to-video: add --strength S "
                           f"(0 < S <= 1, e.g. 0.7; a text-to-video folder), or use a VACE "
                           f"model for a control video")


def check_control_fits(root, index: dict, call: dict) -> None:
    """VACE's inputs: ``mask`` / ``reference_images`` / ``conditioning_scale`` only for a
    ``WanVACEPipeline`` folder; there, they and ``video`` fit the request (frames, size, a
    binary mask), checked before any weights load."""
    from ditax.models.wan.vace_context import mask_frames, reference_frames, video_frames

    vace = index.get("_class_name") == "WanVACEPipeline"
    only = [k for k in ("mask", "reference_images", "conditioning_scale") if k in call]
    if only and not vace:
        raise RequestError(f"--mask / --reference-image / --conditioning-scale are VACE inputs "
                           f"({only[0]} given), but {root} is a {index.get('_class_name')} "
                           f"folder; drop them or use a VACE model (a WanVACEPipeline folder, "
                           f"e.g. Wan-AI/Wan2.1-VACE-1.3B-diffusers)")
    if not vace:
        return
    n, h, w = call["num_frames"], call["height"], call["width"]
    video_frames(call.get("video"), n, h, w)
    mask_frames(call.get("mask"), n, h, w, call.get("video"))
    reference_frames(call.get("reference_images"), h, w, 8)


__all__ = ["WanPipelines", "check_animate_fits", "check_control_fits", "check_images_fit",
           "check_source_video_fits"]
