"""The table of tests/test_conformance.py: every registered family's variants (Wan T2V, I2V,
TI2V, VACE, Animate, V2V, FLUX.1, LTX-2, the toy third family), each with the folder it is tested on,
the capabilities it has, the smallest request that runs it (as CLI flags, a pipeline call and a
server body) and the requests of capabilities it lacks, each answered with exit 2.

Capability names (one row each in the conformance test):

- ``load``: ``ditax.load_pipeline(folder)``;
- ``generate``: ``ditax generate`` writes the family's output kind;
- ``serve``: a ``POST /v1/videos`` body checked by the server's check and run;
- ``batch``: two requests as one batch equal each alone (``pipelines.batch.sample_batch``);
- ``lora`` / ``quantize`` / ``single_file`` / ``folder_check`` / ``step_cache``: the family
  capabilities of the same names in :data:`ditax.models.registry.CAPABILITIES` (a LoRA loads
  and changes the transformer, ``quantize="int8"`` loads 8-bit kernels, a single-file
  checkpoint converts to a folder bit for bit, ``ditax convert FOLDER`` checks a folder, a
  step cache skips transformer calls). A variant may lack one its family declares (VACE and
  Animate: 8-bit loading is refused, and single files with their extra modules are not read);
  no variant has one its family does not declare;
- ``plan``: ``ditax plan PRESET --target cpu:8`` (the toy: a YAML of its config).

Sizes: the smallest each variant's grid takes, one latent frame, one step (two for
video-to-video, whose strength skips one).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Callable

import numpy as np

# the capabilities a family declares in its FamilySpec (ditax.models.registry's vocabulary),
# tested here; the others of a row are the pipeline's (every variant of a family can differ)
FAMILY_CAPS = ("lora", "quantize", "single_file", "folder_check", "step_cache")
PIPELINE_CAPS = ("load", "generate", "serve", "batch", "plan")
ALL_CAPS = PIPELINE_CAPS + FAMILY_CAPS


@dataclasses.dataclass(frozen=True)
class Variant:
    """One row of the table. ``build(tmp, inputs) -> folder``; ``family``: its registry name;
    ``caps``: what it has (:data:`ALL_CAPS` names); ``size``: the call's size keywords;
    ``flags`` / ``call`` / ``body``: its inputs beyond the prompt as generate flags, pipeline
    keywords and JSON fields (``inputs``: the fixture folder of test images and clips);
    ``makes``: the output files generate writes (suffixes of --output's stem);
    ``refusals``: ``(generate flags, words)`` a capability this variant lacks, each exit 2
    with one line holding ``words``; ``plan``: its preset, or ``plan(tmp) -> YAML path``."""

    build: Callable
    family: str
    caps: frozenset
    size: dict
    makes: tuple = (".mp4",)
    flags: Callable = lambda inputs: []
    call: Callable = lambda inputs: {}
    body: Callable = lambda inputs: {}
    refusals: tuple = ()
    plan: str | Callable | None = None
    load: dict = dataclasses.field(default_factory=dict)


def _demo(tmp, inputs):
    from ditax.demo import model_path

    return model_path()


def _flux_demo(tmp, inputs):
    from ditax.demo import flux_model_path

    return flux_model_path()


def _i2v(kind):
    def build(tmp, inputs):
        from i2v_reference import make_tiny_i2v

        return make_tiny_i2v(tmp, kind)[1]
    return build


def _vace(tmp, inputs):
    from vace_reference import make_tiny_vace

    return make_tiny_vace(tmp, two_experts=False)[1]


def _animate(tmp, inputs):
    from animate_reference import make_tiny_animate

    return make_tiny_animate(tmp)[1]


def _toy(tmp, inputs):
    import toy_third

    return toy_third.write_folder(tmp / "toy")


def _ltx2(tmp, inputs):
    from ltx2_pipeline_reference import shared_ltx2_pipeline

    return shared_ltx2_pipeline()[0]


def _flux2(tmp, inputs):
    from flux2_pipeline_reference import shared_klein_folder

    return shared_klein_folder()


def _toy_plan(tmp) -> str:
    """A YAML of the toy's config (it ships no preset): ``ditax plan`` reads any family's."""
    import yaml

    import toy_third

    path = pathlib.Path(tmp) / "toy.yaml"
    path.write_text(yaml.safe_dump({"model": dataclasses.asdict(toy_third.ToyThirdConfig())}))
    return str(path)


def write_inputs(folder: pathlib.Path) -> pathlib.Path:
    """The test images and clips the variants read: ``image16.png`` / ``image32.png`` (a
    first frame), ``src.mp4`` (1 frame, 32x32: video-to-video's source), ``pose.mp4``
    (5 x 32x32) and ``face.mp4`` (5 x 16x16) for Animate, ``lora_*.safetensors`` written
    per folder by :func:`peft_lora`."""
    from i2v_reference import image
    from ditax.io.video import write_mp4

    folder.mkdir(parents=True, exist_ok=True)
    for side in (16, 32):
        image(side, side, side).save(folder / f"image{side}.png")
    clip = lambda n, side, s: np.stack([image(s + i, side, side, "float") for i in range(n)])
    write_mp4(folder / "src.mp4", clip(1, 32, 1))
    write_mp4(folder / "pose.mp4", clip(5, 32, 10))
    write_mp4(folder / "face.mp4", clip(5, 16, 20))
    return folder


def read_inputs(inputs: pathlib.Path, names) -> dict:
    """Pipeline keywords from the input files: ``{keyword: file name}`` → arrays / images."""
    from ditax.io.images import read_image
    from ditax.io.video import read_video

    return {k: read_image(inputs / f) if f.endswith(".png") else read_video(inputs / f) / 255.0
            for k, f in names.items()}


def b64(path) -> str:
    import base64

    return base64.b64encode(pathlib.Path(path).read_bytes()).decode()


def peft_lora(folder, out, rank: int = 2, seed: int = 0) -> pathlib.Path:
    """A random diffusers / PEFT LoRA (``transformer.<module>.lora_A/B.weight``) on every
    first-block ``to_q`` of the transformer in ``folder`` (shapes read from its safetensors
    headers: any family whose transformer keeps diffusers' module names), big enough that a
    merged weight visibly moves."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for f in sorted((pathlib.Path(folder) / "transformer").glob("*.safetensors")):
        with safe_open(str(f), "numpy") as st:
            for k in st.keys():
                if k.startswith(("blocks.0.", "transformer_blocks.0.")) \
                        and k.endswith(".to_q.weight"):
                    o, i = st.get_slice(k).get_shape()
                    m = k.removesuffix(".weight")
                    tensors[f"transformer.{m}.lora_A.weight"] = \
                        (0.3 * rng.standard_normal((rank, i))).astype(np.float32)
                    tensors[f"transformer.{m}.lora_B.weight"] = \
                        (0.3 * rng.standard_normal((o, rank))).astype(np.float32)
    assert tensors, f"no first-block to_q in {folder}"
    save_file(tensors, str(out))
    return pathlib.Path(out)


WAN_CAPS = frozenset({"load", "generate", "lora", "quantize", "single_file", "folder_check",
                      "step_cache"})
SMALL = dict(num_inference_steps=1, guidance_scale=2.0)


def _size_flags(size: dict) -> list[str]:
    names = dict(height="--height", width="--width", num_frames="--frames",
                 num_inference_steps="--steps", guidance_scale="--guidance")
    return [a for k, v in size.items() for a in (names[k], str(v))]


VARIANTS = {
    "wan-t2v": Variant(
        _demo, "wan", WAN_CAPS | {"serve", "batch", "plan"},
        dict(height=32, width=32, num_frames=1, **SMALL), plan="tiny",
        refusals=((["--true-cfg", "3", "--negative-prompt", "x"], "--true-cfg is not taken "
                   "by wan models"),
                  (["--image", "{inputs}/image32.png"], "text-to-video"))),
    "wan-i2v": Variant(
        _i2v("i2v"), "wan", WAN_CAPS | {"serve", "batch", "plan"},
        dict(height=16, width=16, num_frames=1, **SMALL), plan="wan2.1-i2v-14b-480p",
        flags=lambda d: ["--image", str(d / "image16.png")],
        call=lambda d: read_inputs(d, {"image": "image16.png"}),
        body=lambda d: {"image": b64(d / "image16.png")},
        refusals=((["--video", "{inputs}/src.mp4", "--strength", "0.5"], "text-to-video"),)),
    "wan-ti2v": Variant(
        _i2v("ti2v"), "wan", WAN_CAPS | {"serve", "batch", "plan"},
        # 5 frames: the image replaces the first latent frame, so one frame is the image alone
        dict(height=32, width=32, num_frames=5, **SMALL), plan="wan2.2-ti2v-5b",
        flags=lambda d: ["--image", str(d / "image32.png")],
        call=lambda d: read_inputs(d, {"image": "image32.png"}),
        body=lambda d: {"image": b64(d / "image32.png")}),
    "wan-vace": Variant(
        _vace, "wan", WAN_CAPS - {"quantize", "single_file"} | {"serve", "batch", "plan"},
        dict(height=16, width=16, num_frames=1, **SMALL), plan="wan2.1-vace-1.3b",
        refusals=((["--image", "{inputs}/image16.png"], "image"),)),
    "wan-animate": Variant(
        _animate, "wan", WAN_CAPS - {"quantize", "single_file"} | {"plan"},
        dict(height=32, width=32, num_inference_steps=1, guidance_scale=1.0),
        plan="wan2.2-animate-14b",
        flags=lambda d: ["--image", str(d / "image32.png"), "--pose-video", str(d / "pose.mp4"),
                         "--face-video", str(d / "face.mp4"), "--segment-frame-length", "5",
                         "--prev-segment-frames", "1"],
        call=lambda d: dict(read_inputs(d, {"image": "image32.png", "pose_video": "pose.mp4",
                                            "face_video": "face.mp4"}),
                            segment_frame_length=5, prev_segment_conditioning_frames=1)),
    "wan-v2v": Variant(
        _demo, "wan", WAN_CAPS | {"plan"},
        dict(height=32, width=32, num_frames=1, num_inference_steps=2, guidance_scale=2.0),
        load=dict(video_to_video=True), plan="tiny",     # its model is a text-to-video one
        flags=lambda d: ["--video", str(d / "src.mp4"), "--strength", "0.5"],
        call=lambda d: dict(read_inputs(d, {"video": "src.mp4"}), strength=0.5)),
    "flux": Variant(
        _flux_demo, "flux", frozenset({"load", "generate", "serve", "batch", "plan", "lora",
                                       "quantize", "single_file", "folder_check"}),
        dict(height=32, width=32, **SMALL), makes=(".png",), plan="flux-tiny",
        refusals=((["--frames", "5"], "--frames is not taken by flux models"),
                  (["--image", "{inputs}/image32.png"], "--image is not taken by flux"),
                  (["--video", "{inputs}/src.mp4", "--strength", "0.5"],
                   "is not taken by flux models"))),
    "ltx2": Variant(
        _ltx2, "ltx2", frozenset({"load", "generate", "serve", "batch", "folder_check",
                                  "lora", "quantize", "single_file", "step_cache"}),
        # two steps: LTX-2's schedule ends at its terminal sigma, which one step cannot
        dict(height=32, width=32, num_frames=1, num_inference_steps=2, guidance_scale=2.0),
        refusals=((["--true-cfg", "3", "--negative-prompt", "x"], "--true-cfg is not taken by "
                   "ltx2 models"),
                  (["--video", "{inputs}/src.mp4", "--strength", "0.5"],
                   "is not taken by ltx2 models"))),
    "flux2-klein": Variant(
        _flux2, "flux2", frozenset({"load", "generate", "serve", "batch", "plan", "lora",
                                    "quantize", "single_file", "folder_check"}),
        dict(height=32, width=32, **SMALL), makes=(".png",), plan="flux2-tiny",
        refusals=((["--frames", "5"], "--frames is not taken by flux2 models"),
                  (["--true-cfg", "3", "--negative-prompt", "x"], "--true-cfg is not taken by "
                   "flux2"),
                  (["--video", "{inputs}/src.mp4", "--strength", "0.5"],
                   "is not taken by flux2 models"))),
    "toy": Variant(
        _toy, "toythird", frozenset({"load", "generate", "serve", "batch", "plan"}),
        dict(height=16, width=16, **SMALL), makes=(".mp4", ".aux.npy"),   # 1 frame: its own
        plan=_toy_plan,
        refusals=((["--true-cfg", "3", "--negative-prompt", "x"], "--true-cfg is not taken by "
                   "toythird models"),)),   # its lacking LoRA, 8-bit, ...: test_lacking
}


def generate_argv(v: Variant, folder, inputs, out, extra=()) -> list[str]:
    """``ditax generate`` of the variant's smallest request, writing ``out``."""
    return ["generate", "--model", str(folder), "--prompt", "a red circle moves right",
            "--seed", "1", *_size_flags(v.size), *v.flags(inputs), "--output", str(out),
            "--no-progress", *extra]


def single_file_config(folder, family: str, tmp) -> pathlib.Path:
    """A YAML whose model section is the pipeline folder's transformer, as the family reads
    it (:meth:`~ditax.models.base.ModelFamily.folder_config`; ``ditax convert --config``)."""
    import yaml

    from ditax.models import registry

    fixed = registry.spec(family).family_class().folder_config(folder)
    section = {"family": family, **{k: list(v) if isinstance(v, tuple) else v
                                    for k, v in fixed.items()}}
    path = pathlib.Path(tmp) / "arch.yaml"
    path.write_text(yaml.safe_dump({"name": "conformance", "model": section}))
    return path


__all__ = ["ALL_CAPS", "FAMILY_CAPS", "VARIANTS", "Variant", "b64", "generate_argv", "peft_lora",
           "read_inputs", "single_file_config", "write_inputs"]
