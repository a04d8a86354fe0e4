"""FLUX.1's pipelines as the shared entry points see them
(:class:`~ditax.pipelines.family.PipelineFamily`): its sample defaults, the request checks and
loading."""

from __future__ import annotations

from ditax.errors import RequestError
from ditax.pipelines.family import PipelineFamily
from ditax.pipelines.request import Field

SAMPLE_DEFAULTS = dict(height=1024, width=1024, num_frames=1, num_inference_steps=28,
                       guidance_scale=3.5, guidance_scale_2=None, negative_prompt=None,
                       max_sequence_length=512, fps=None, true_cfg_scale=1.0)


# FLUX.1's own request fields, beside the common ones (ditax.pipelines.request.COMMON)
FIELDS = (
    Field("true_cfg_scale", "float", "true CFG scale > 1 against the negative prompt (the "
          "pipeline's true_cfg_scale; the guidance stays the embedded guidance); off by "
          "default", optional=True, minimum=0.0, flag="--true-cfg", example=4.0,
          metavar="SCALE"),
)


class FluxPipelines(PipelineFamily):
    """FLUX.1-dev / schnell text-to-image folders (``FluxPipeline``)."""

    name = "flux"
    parallel_vae = True        # vae_parallel=True: ditax.models.vae.parallel
    makes = "image"
    sample_defaults = SAMPLE_DEFAULTS
    # a still image, no second expert, no video writer; a negative prompt turns on true CFG,
    # which a folder's defaults do not choose
    sample_file_keys = ("height", "width", "num_inference_steps", "guidance_scale",
                        "max_sequence_length")
    fields = FIELDS
    # a few-step student's schedule (ditax.pipelines.lora_sample): always Euler; a flow_shift
    # replaces the folder's resolution-dependent shift
    lora_sample_keys = ("num_inference_steps", "guidance_scale", "true_cfg_scale",
                        "flow_shift", "sigmas")

    def check_request(self, prompt, height, width, num_frames=None,
                      num_inference_steps=28, guidance_scale=3.5, guidance_scale_2=None,
                      negative_prompt=None, seed=0, true_cfg_scale=None) -> None:
        """The request checks of :func:`ditax.pipelines.flux.request.check_request` but the
        size grid, which is the folder's VAE's (:meth:`preflight`); ``true_cfg_scale`` None:
        4.0 with a negative prompt, else 1 (off)."""
        from ditax.pipelines.flux.request import check_request

        if num_frames not in (None, 1):
            raise RequestError(f"{num_frames} frames: FLUX.1 makes still images; drop --frames")
        if guidance_scale_2 is not None:
            raise RequestError("guidance_scale_2 is a two-expert video model's; FLUX.1 has one "
                               "transformer — drop it")
        check_request(prompt, None, height, width, num_inference_steps, guidance_scale,
                      negative_prompt, true_cfg_scale if true_cfg_scale is not None
                      else 4.0 if negative_prompt is not None else 1.0, 512, seed,
                      factor=None)

    def sample_options(self, given, sample, chosen, defaults, call):
        """The call's text length (the folder's, else FLUX.1's 512 T5 tokens) and ``sigmas``;
        the loader's flow shift (``sample.flow_shift``: a fixed shift instead of the folder's
        resolution-dependent one)."""
        return ({"max_sequence_length": defaults["max_sequence_length"],
                 "sigmas": sample.sigmas}, {"flow_shift": sample.flow_shift})

    def preflight(self, root, load: dict, call: dict | None = None, mesh=None) -> None:
        """The folder has a Flux transformer, the request takes no image and fits the size
        grid of the folder's VAE (its factor from ``vae/config.json``), and the attention
        backend runs here with the folder's head dim."""
        from ditax.attention import check_available
        from ditax.io.files import read_model_json
        from ditax.io.hub import resolve_folder
        from ditax.models.flux.family import vae_factor
        from ditax.models.flux.loading import read_config
        from ditax.models.flux.packing import PACK
        from ditax.pipelines.flux.request import check_size

        if call is not None and ("image" in call or "last_image" in call):
            raise RequestError(f"--image / --last-image given but {root} is a text-to-image "
                               f"folder (FluxPipeline); drop them")
        sizes = {k: call[k] for k in ("height", "width") if k in call} if call else {}
        if sizes:
            vae = read_model_json(resolve_folder(root, "vae") / "config.json", "VAE config")
            check_size(vae_factor(vae) * PACK, **sizes)
        tc = read_config(resolve_folder(root, "transformer"))
        head_dim = load.get("attention_head_dim") or tc["attention_head_dim"]
        check_available(load["attention"], mesh=mesh, dtype=load["dtype"], head_dim=head_dim)

    def load(self, path, **kwargs):
        from ditax.pipelines.flux.loading import load_pipeline

        return load_pipeline(path, **kwargs)


__all__ = ["FluxPipelines", "SAMPLE_DEFAULTS"]
