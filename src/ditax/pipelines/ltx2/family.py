"""LTX-2's pipelines as the shared entry points see them
(:class:`~ditax.pipelines.family.PipelineFamily`): video with a sound track, its request fields
(frame rate and the per-modality guidance of diffusers' ``LTX2Pipeline``), the request checks
and loading."""

from __future__ import annotations

from ditax.errors import RequestError
from ditax.intmath import INT_LIMIT
from ditax.pipelines.family import PipelineFamily
from ditax.pipelines.inputs import Input
from ditax.pipelines.request import Field

#: diffusers' ``LTX2Pipeline`` defaults (0.42): 768x512, 121 frames at 24 fps, 30 steps, video
#: CFG 3 / audio CFG 7, spatio-temporal guidance 1, modality guidance 3, rescale 0.7, 1024
#: text tokens
SAMPLE_DEFAULTS = dict(height=512, width=768, num_frames=121, num_inference_steps=30,
                       guidance_scale=3.0, guidance_scale_2=None, negative_prompt=None,
                       max_sequence_length=1024, fps=24, frame_rate=24.0,
                       audio_guidance_scale=7.0, guidance_rescale=0.7,
                       audio_guidance_rescale=0.7, stg_scale=1.0, audio_stg_scale=1.0,
                       modality_scale=3.0, audio_modality_scale=3.0, decode_timestep=0.0,
                       decode_noise_scale=None)

_SCALE = dict(kind="float", minimum=0.0, maximum=100.0)

FIELDS = (
    Field("num_frames", "int", "video frames, 8k+1 (default: the folder's, else 121)",
          minimum=1, maximum=INT_LIMIT - 1, flag="--frames", limit="max_frames", example=121),
    Field("frame_rate", "float", "frames per second the video is made for (its motion and the "
          "sound's length follow it; default 24)", minimum=1.0, maximum=240.0, example=24.0),
    Field("audio_guidance_scale", help="the sound track's CFG scale (<= 1: off; default 7)",
          example=7.0, **_SCALE),
    Field("guidance_rescale", "float", "how far the guided video's spread is pulled back to "
          "the conditional one's (0: off; default 0.7)", minimum=0.0, maximum=1.0,
          example=0.7),
    Field("audio_guidance_rescale", "float", "the same for the sound track (default 0.7)",
          minimum=0.0, maximum=1.0, example=0.7),
    Field("stg_scale", help="spatio-temporal guidance of the video (a forward with "
          "self-attention skipped in the chosen blocks; 0: off; default 1)", example=1.0,
          **_SCALE),
    Field("audio_stg_scale", help="spatio-temporal guidance of the sound (default 1)",
          example=1.0, **_SCALE),
    Field("modality_scale", help="modality guidance of the video (against a forward without "
          "the audio<->video attention; 1: off; default 3)", example=3.0, **_SCALE),
    Field("audio_modality_scale", help="modality guidance of the sound (default 3)",
          example=3.0, **_SCALE),
    Field("decode_timestep", "float", "the timestep-conditioned VAE's decode timestep "
          "(default 0)", minimum=0.0, maximum=1.0, example=0.05),
    Field("decode_noise_scale", "float", "noise mixed into the latents before that decode "
          "(default: the decode timestep)", optional=True, minimum=0.0, maximum=1.0,
          example=0.025),
    Field("image_crf", "int", "H.264 CRF the --image is re-compressed at first, as LTX-2 saw "
          "its training frames (0: none; default 33)", optional=True, minimum=0, maximum=51,
          example=33),
)


class LTX2Pipelines(PipelineFamily):
    """LTX-2 text- and image-to-video-with-sound folders (diffusers ``LTX2Pipeline``,
    ``LTX2ImageToVideoPipeline``)."""

    name = "ltx2"
    makes = "video"
    outputs = ("audio",)           # an AudioTrack: muxed into the mp4 (--no-audio: none)
    muxed = ("audio",)
    sample_defaults = SAMPLE_DEFAULTS
    fields = FIELDS
    # a folder's ditax_sample.json: the size and steps, and every guidance term (a few-step
    # student's folder turns them all off: ditax export of a distillation run)
    sample_file_keys = ("height", "width", "num_frames", "num_inference_steps",
                        "guidance_scale", "max_sequence_length", "fps", "frame_rate",
                        "audio_guidance_scale", "guidance_rescale", "audio_guidance_rescale",
                        "stg_scale", "audio_stg_scale", "modality_scale", "audio_modality_scale")
    cli_inputs = ("image", "upsampler")
    inputs = (Input("image", "first frame (image-to-video)", metavar="FIRST.png"),
              Input("upsampler", "an LTX2LatentUpsamplePipeline folder: two-stage sampling, "
                    "stage 1 at the size over its factor, upsampled, refined on LTX-2's "
                    "distilled sigmas at the full size", metavar="FOLDER"))
    parallel_vae = True        # vae_parallel=True: ditax.models.vae.parallel (the video decode)

    def text_encoders(self, pipe) -> list:
        """Gemma-3 (the connectors are small and stay on the device)."""
        return [pipe.text.text_encoder]

    def read_inputs(self, given, call: dict, sample) -> dict:
        from ditax.io.images import read_image

        if given.get("image") is not None:
            call = {**call, "image": read_image(given["image"], "--image")}
        if given.get("upsampler") is not None:
            call = {**call, "upsampler": given["upsampler"]}
        return call

    def check_request(self, prompt, height, width, num_frames=None, num_inference_steps=None,
                      guidance_scale=None, guidance_scale_2=None, negative_prompt=None,
                      seed=0, **fields) -> None:
        """Sizes on LTX-2's grid (multiples of 32; frames 8k+1), one transformer."""
        from ditax.pipelines.ltx2.request import check_request

        if guidance_scale_2 is not None:
            raise RequestError("guidance_scale_2 is a two-expert video model's; LTX-2 has one "
                               "transformer — drop it")
        check_request(height=height, width=width, num_frames=num_frames, **fields)

    def sample_options(self, given, sample, chosen, defaults, call):
        """The call's text length (the folder's, else 1024 Gemma tokens)."""
        return {"max_sequence_length": defaults["max_sequence_length"]}, {}

    def preflight(self, root, load: dict, call: dict | None = None, mesh=None) -> None:
        """The folder has the parts of an LTX-2 pipeline, the request fits its grid (an
        image-to-video folder gets its image), and the attention backend runs here with the
        transformer's head dims."""
        from ditax.pipelines.ltx2.loading import preflight

        preflight(root, load, call, mesh)

    def load(self, path, **kwargs):
        from ditax.pipelines.family import resolve
        from ditax.pipelines.ltx2.loading import load_pipeline
        from ditax.pipelines.ltx2.upsample import (PIPELINE_CLASS, folder_class,
                                                   load_upsample_pipeline)

        if folder_class(resolve(path)) == PIPELINE_CLASS:     # the two-stage recipe's middle
            return load_upsample_pipeline(path, **kwargs)
        return load_pipeline(path, **kwargs)


__all__ = ["FIELDS", "LTX2Pipelines", "SAMPLE_DEFAULTS"]
