"""FLUX.2's pipelines as the shared entry points see them
(:class:`~ditax.pipelines.family.PipelineFamily`): still images, its sample defaults, its input
flags (reference images), the request checks and loading."""

from __future__ import annotations

from ditax.errors import RequestError
from ditax.pipelines.family import PipelineFamily
from ditax.pipelines.inputs import Input

#: diffusers' ``Flux2Pipeline`` / ``Flux2KleinPipeline`` defaults (0.42): 1024x1024, 50 steps,
#: 512 text tokens; the guidance scale None: the folder's kind decides (4 for dev and klein
#: base, none for a distilled klein: :func:`ditax.pipelines.flux2.request.guidance_for`)
SAMPLE_DEFAULTS = dict(height=1024, width=1024, num_frames=1, num_inference_steps=50,
                       guidance_scale=None, guidance_scale_2=None, negative_prompt=None,
                       max_sequence_length=512, fps=None)


class Flux2Pipelines(PipelineFamily):
    """FLUX.2 dev (``Flux2Pipeline``) and klein (``Flux2KleinPipeline``, distilled or base)
    folders: text-to-image and image-conditioned generation from reference images."""

    name = "flux2"
    makes = "image"
    parallel_vae = True        # vae_parallel=True: ditax.models.vae.parallel (a FluxVAE)
    reference_images = True    # image=: a list of references, their sizes part of the program
    sample_defaults = SAMPLE_DEFAULTS
    # a still image, one transformer; the guidance default is the folder's kind's unless the
    # file sets it
    sample_file_keys = ("height", "width", "num_inference_steps", "guidance_scale",
                        "max_sequence_length")
    cli_inputs = ("image", "reference_image")
    # (flags the video families share, with their own meaning there: the help says both)
    inputs = (Input("image", "input image: the first frame (image-to-video folders) or a "
                    "reference image (FLUX.2)", metavar="IMAGE.png"),
              Input("reference_image", "reference image (repeatable): FLUX.2 generates from "
                    "them (after --image); VACE folders fit each on a white frame before the "
                    "video", metavar="REF.png", aliases=("--reference",), repeat=True))

    def text_encoders(self, pipe) -> list:
        """The Qwen3 / Mistral-3 text model."""
        return [pipe.text_encoder]

    def read_inputs(self, given, call: dict, sample) -> dict:
        """``--image`` then each ``--reference-image``, read into the call's ``image=`` (a
        list; diffusers' multi-reference argument)."""
        from ditax.io.images import read_image

        paths = [("--image", given.get("image"))] + [
            ("--reference-image", p) for p in (given.get("reference_image") or [])]
        images = [read_image(p, flag) for flag, p in paths if p is not None]
        return {**call, "image": images} if images else call

    def check_request(self, prompt, height, width, num_frames=None, num_inference_steps=None,
                      guidance_scale=None, guidance_scale_2=None, negative_prompt=None,
                      seed=0, **fields) -> None:
        """The checks of :func:`ditax.pipelines.flux2.request.check_request` that hold for
        every FLUX.2 folder (the size grid and the guidance's fit to the folder's kind are
        :meth:`preflight`'s)."""
        from ditax.pipelines.flux2.request import check_request

        if num_frames not in (None, 1):
            raise RequestError(f"{num_frames} frames: FLUX.2 makes still images; drop --frames")
        if guidance_scale_2 is not None:
            raise RequestError("guidance_scale_2 is a two-expert video model's; FLUX.2 has one "
                               "transformer — drop it")
        check_request(prompt, height, width, num_inference_steps, guidance_scale,
                      negative_prompt, 512, seed, kind=None, grid=None)

    def sample_options(self, given, sample, chosen, defaults, call):
        """The call's text length (the folder's, else 512) and ``sigmas``; with reference
        images and no size given, the size None: the first reference's (diffusers' rule)."""
        own = {"max_sequence_length": defaults["max_sequence_length"], "sigmas": sample.sigmas}
        if call.get("image"):
            for k in ("height", "width"):
                if given.get(k) is None and k not in chosen:
                    own[k] = None
        return own, {}

    def preflight(self, root, load: dict, call: dict | None = None, mesh=None) -> None:
        """The folder is a FLUX.2 one with every part, the request fits its kind (guidance,
        negative prompt) and its size grid (the VAE's factor from ``vae/config.json``), its
        reference images are usable, and the attention backend runs here with the
        transformer's head dim."""
        from ditax.attention import check_available
        from ditax.io.files import read_model_json
        from ditax.pipelines.flux2.folder import folder_kind, size_grid
        from ditax.pipelines.flux2.references import check_references, reference_list
        from ditax.pipelines.flux2.request import check_guidance, check_size

        kind = folder_kind(root)
        if call:
            if "last_image" in call:
                raise RequestError(f"--last-image given but {root} is a FLUX.2 folder (still "
                                   f"images); pass reference images with --image / --reference-image")
            check_guidance(kind, call.get("guidance_scale"), call.get("negative_prompt"))
            grid = size_grid(root)
            check_size(grid, height=call.get("height"), width=call.get("width"))
            check_references(reference_list(call.get("image")), grid)
        tc = read_model_json(root / "transformer" / "config.json", "transformer config")
        check_text_layers_fit(root, kind, load.get("text_encoder_out_layers"), tc)
        head_dim = load.get("attention_head_dim") or tc.get("attention_head_dim", 128)
        check_available(load["attention"], mesh=mesh, dtype=load["dtype"], head_dim=head_dim)

    def load(self, path, **kwargs):
        from ditax.pipelines.flux2.loading import load_pipeline

        return load_pipeline(path, **kwargs)


def check_text_layers_fit(root, kind: str, layers, tc: dict) -> None:
    """The hidden states the calls read by default (``layers``: ``model.
    text_encoder_out_layers``, None: the kind's) exist in the folder's text encoder
    (``text_encoder/config.json``: its layers and width) and fill the transformer's
    ``joint_attention_dim`` (``tc``), before any weights; else one line suggesting layers
    that do, with the key that sets them."""
    import pathlib

    from ditax.io.files import read_model_json
    from ditax.models.encoders.decoder_lm.flux2_text import check_text_layers
    from ditax.pipelines.flux2.loading import text_parts

    f = pathlib.Path(root) / "text_encoder" / "config.json"
    raw = read_model_json(f, "text encoder config") if f.is_file() else None
    raw = raw.get("text_config", raw) if isinstance(raw, dict) else {}
    n, width = raw.get("num_hidden_layers"), raw.get("hidden_size")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, width)):
        return                           # the loader names what the file lacks
    joint = tc.get("joint_attention_dim") if isinstance(tc, dict) else None
    said = ("model.text_encoder_out_layers" if layers is not None else
            f"FLUX.2 {kind}'s default text_encoder_out_layers")
    check_text_layers(layers if layers is not None else text_parts(kind)[3], n, width, joint,
                      where=f"{root}'s text encoder", said=said)


__all__ = ["Flux2Pipelines", "SAMPLE_DEFAULTS", "check_text_layers_fit"]
