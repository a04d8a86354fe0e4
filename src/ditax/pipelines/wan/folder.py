"""A diffusers Wan pipeline folder: where its components are, checked before anything loads.

``WanPipeline.save_pretrained`` writes ``model_index.json`` (component names → classes, and for
Wan 2.2 A14B ``boundary_ratio``) next to one subfolder per component: ``tokenizer/``,
``text_encoder/``, ``vae/``, ``scheduler/``, ``transformer/`` and optionally
``transformer_2/``. ``WanImageToVideoPipeline`` folders add ``image_encoder/`` and
``image_processor/`` (Wan 2.1 I2V / FLF2V; Wan 2.2 I2V A14B has none), and either class may set
``expand_timesteps`` (Wan 2.2 TI2V-5B: per-token timesteps, the image optional).
``WanVideoToVideoPipeline`` folders hold a text-to-video model's components (loaded as
video-to-video: a source video required).
:func:`read_pipeline_folder` resolves a path or hub id (through
:func:`ditax.io.hub.resolve_folder`), reads the index and returns the component folders, or
raises :class:`PipelineLoadError` naming what is missing and how to fix it.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from ditax.errors import ModelNotFound, PipelineLoadError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.models.wan.conditioning import I2V_PIPELINE, folder_kind

REQUIRED = ("tokenizer", "text_encoder", "vae", "scheduler")  # besides transformer
ANIMATE_PIPELINE = "WanAnimatePipeline"   # Wan 2.2 Animate: an image-conditioned (i2v) folder
V2V_PIPELINE = "WanVideoToVideoPipeline"  # a text-to-video model's parts, run video-to-video
CLASSES = ("WanPipeline", I2V_PIPELINE, "WanVACEPipeline", ANIMATE_PIPELINE, V2V_PIPELINE)
IMAGE_PARTS = ("image_encoder", "image_processor")  # Wan 2.1 I2V / FLF2V: both or neither


@dataclass(frozen=True)
class PipelineFolder:
    """A checked pipeline folder. ``components`` maps each present component name
    (``REQUIRED``, ``transformer`` and optionally ``transformer_2``) to its subfolder."""

    root: pathlib.Path
    index: dict
    components: dict[str, pathlib.Path]

    @property
    def kind(self) -> str:
        """``"t2v"`` (text only), ``"i2v"`` (an image is required: noise, mask and condition
        latents as transformer channels) or ``"ti2v"`` (``expand_timesteps``: an optional
        image replaces the first latent frame, whose tokens run at t=0)."""
        if self.index.get("_class_name") == ANIMATE_PIPELINE:
            return "i2v"
        return folder_kind(self.index)

    @property
    def boundary_ratio(self) -> float | None:
        """Wan 2.2 expert switch: ``transformer`` while ``t >= boundary_ratio * T``."""
        return self.index.get("boundary_ratio")

    def scheduler_config(self) -> dict:
        """The folder's ``scheduler/scheduler_config.json`` as a dict."""
        path = self.components["scheduler"] / "scheduler_config.json"
        if not path.is_file():
            raise PipelineLoadError(f"{self.components['scheduler']} has no scheduler_config.json")
        return read_model_json(path, "scheduler config")


def resolve_pipeline_folder(path) -> pathlib.Path:
    """Local folder with ``model_index.json`` (a path, or a hub id downloaded when online)."""
    try:
        return resolve_folder(path, None, required=("model_index.json",))
    except ModelNotFound as e:
        raise PipelineLoadError(f"{e}. A pipeline folder is what diffusers' "
                                f"WanPipeline.save_pretrained writes (model_index.json + "
                                f"tokenizer/ text_encoder/ vae/ scheduler/ transformer/)") from None


def _component_present(index: dict, name: str) -> bool:
    entry = index.get(name)
    return not (entry is None or (isinstance(entry, (list, tuple)) and entry[0] is None))


def _need(root: pathlib.Path, index: dict, name: str) -> pathlib.Path:
    sub = root / name
    if not _component_present(index, name):
        raise PipelineLoadError(f"{root}/model_index.json has no {name!r} component; ditax "
                                f"needs tokenizer, text_encoder, vae, scheduler and transformer")
    if not sub.is_dir():
        raise PipelineLoadError(f"{root}/model_index.json lists {name!r} but the folder "
                                f"{sub} is missing; re-download or re-save the pipeline")
    return sub


def read_pipeline_folder(path) -> PipelineFolder:
    """Resolve ``path`` (folder or hub id) and check it is a Wan pipeline folder (text-,
    image- or text-image-to-video) with every component ditax needs."""
    root = resolve_pipeline_folder(path)
    index = read_model_json(root / "model_index.json", "model_index.json")
    cls = index.get("_class_name")
    if cls not in (None, *CLASSES):
        raise PipelineLoadError(f"{root}/model_index.json is a {cls}; ditax loads "
                                f"{' and '.join(CLASSES)} folders")
    subs = {n: _need(root, index, n) for n in REQUIRED}
    image_parts = [n for n in IMAGE_PARTS if _component_present(index, n)]
    if image_parts and cls not in (I2V_PIPELINE, ANIMATE_PIPELINE):
        raise PipelineLoadError(f"{root}/model_index.json is a {cls} with {image_parts[0]!r}; "
                                f"image encoders belong to WanImageToVideoPipeline folders")
    if len(image_parts) == 1:
        missing = next(n for n in IMAGE_PARTS if n not in image_parts)
        raise PipelineLoadError(f"{root}/model_index.json has {image_parts[0]!r} but no "
                                f"{missing!r}; Wan 2.1 image-to-video needs both (re-save the "
                                f"pipeline with its CLIPImageProcessor and CLIPVisionModel)")
    subs.update({n: _need(root, index, n) for n in image_parts})
    if not _component_present(index, "transformer"):
        raise PipelineLoadError(f"{root}/model_index.json has no 'transformer'; ditax needs it "
                                f"(transformer_2 alone is not supported)")
    subs["transformer"] = _need(root, index, "transformer")
    if _component_present(index, "transformer_2"):
        subs["transformer_2"] = _need(root, index, "transformer_2")
    return PipelineFolder(root=root, index=index, components=subs)


__all__ = ["PipelineFolder", "PipelineLoadError", "V2V_PIPELINE", "read_pipeline_folder",
           "resolve_pipeline_folder"]
