"""``make demo``: the demo model ditax trained itself, prompt → video on a fresh machine.

The model (``ditax.demo.model_path()``, a diffusers ``WanPipeline`` folder shipped in the
package) was trained from nothing by ``make demo-model`` (:mod:`ditax.recipes.demo_model`):
synthetic clips of one bright object (red / green / blue / yellow / white circle or square)
moving left / right / up / down on a dark background; prompts ``a {colour} {shape} moves
{direction}``; five combinations held out of training. :data:`SAMPLE` is how it is meant to
be sampled.

The model's 4-step student (``ditax.demo.student_lora_path()``, a LoRA distilled from it by
``make demo-student``: :mod:`ditax.recipes.demo_student`) samples in 4 Euler steps without
guidance (:data:`STUDENT_SAMPLE`; the loader's part, Euler and its shift, :data:`STUDENT_LOAD`,
is also carried by the LoRA file, so ``load_pipeline(model_path(), loras=[(student_lora_path(),
1.0)])`` applies it).

The model's causal student (``ditax.demo.causal_model_path()``, ``--model demo-causal``: a
folder whose transformer is block-causal, distilled by Self-Forcing in ``make demo-causal``,
:mod:`ditax.recipes.demo_causal`) makes a video chunk by chunk against a KV cache, past the
teacher's 17 frames (:mod:`ditax.demo.causal` scores it per window of the teacher's length).

``python -m ditax.demo`` (:mod:`ditax.demo.run`) generates three prompts (one held out) with
the model and with its student, writes ``demo_out/*.mp4``, ``demo_out/student_*.mp4`` and
``demo_out/contact_sheet.png`` (each teacher row above its student row), prints per-phase
timings of both and their prompt-following scores (:mod:`ditax.synthetic.score`).
``ditax generate --model demo --prompt ...`` samples it too.

The random-weights folder builders (:func:`ditax.demo.folders.build_pipeline_folder`) are what
tests and benchmarks use for a small Wan pipeline of any shape.
"""

from __future__ import annotations

import pathlib

# the package's shipped models
_ASSETS = pathlib.Path(__file__).parent.parent / "assets"

DEMO_PROMPTS = ("a red circle moves right", "a blue square moves up",
                "a yellow circle moves right")       # the last one is a held-out combination
FLUX_PROMPTS = ("a red circle on the left", "a blue square on the top",
                "a yellow circle on the right")     # the last one is a held-out combination

# how the demo recipe's models are meant to be sampled, besides their training size (written
# into the folder's ditax_sample.json by the recipe); guidance 8 measured best for direction on
# the previous (batch-16) model (benchmarks/demo_quality.py, seen combinations x 3 seeds:
# direction 95.2% at 4, 98.1% at 5, 99.0% at 6, 100% at 8; colour 100% at each); the shipped
# model at 8: colour 95.2%, direction 98.1%
SAMPLE_STEPS, SAMPLE_GUIDANCE = 25, 8.0


def sample_defaults(height: int, width: int, frames: int, text_len: int) -> dict:
    """The ``ditax_sample.json`` of a demo-recipe model trained at this size (the pipeline
    call's keyword arguments of those names)."""
    return dict(height=height, width=width, num_frames=frames,
                num_inference_steps=SAMPLE_STEPS, guidance_scale=SAMPLE_GUIDANCE,
                negative_prompt="", max_sequence_length=text_len)


def write_sample_defaults(folder, values: dict):
    """Write ``values`` as ``folder``'s ``ditax_sample.json`` (checked); returns the path."""
    from ditax.pipelines.sample_defaults import write_sample_defaults as write

    return write(folder, values)


def __getattr__(name: str):
    """``SAMPLE``: keyword arguments of the pipeline call the shipped demo model is meant to be
    sampled with, read from its folder's ``ditax_sample.json`` (one source: what
    ``load_pipeline(model_path())`` then ``pipe(prompt)`` uses too). ``FLUX_SAMPLE``: the
    same for the small Flux (:func:`flux_model_path`; the Flux pipeline call's keywords);
    ``FLUX_STUDENT_SAMPLE`` for its 4-step student LoRA (:func:`flux_student_lora_path`). A
    fresh dict each time."""
    if name == "SAMPLE":
        from ditax.pipelines.sample_defaults import CALL_KEYS, read_sample_defaults

        values = read_sample_defaults(model_path())
        return {k: v for k, v in values.items() if k in CALL_KEYS}
    if name in ("STUDENT_SAMPLE", "STUDENT_LOAD"):
        return student_settings(load=name == "STUDENT_LOAD")
    if name == "FLUX_SAMPLE":
        from ditax.io.files import read_model_json

        return dict(read_model_json(flux_model_path() / "ditax_sample.json", "ditax_sample.json"))
    if name == "FLUX_STUDENT_SAMPLE":
        return _flux_student_sample()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def model_path() -> pathlib.Path:
    """The shipped demo pipeline folder (inside the installed package)."""
    path = _ASSETS / "demo_model"
    if not (path / "model_index.json").is_file():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the demo model is missing from {path}; reinstall ditax, or "
                            "train it with `make demo-model`")
    return path


STUDENT_DIR = "demo_student"
STUDENT_LORA = "lora.safetensors"


def student_lora_path() -> pathlib.Path:
    """The demo model's shipped 4-step student: a LoRA (diffusers / PEFT keys) on
    :func:`model_path`, distilled by ``make demo-student`` (:mod:`ditax.recipes.demo_student`).
    Its file carries its sampling settings (safetensors metadata ``ditax_sample``), also
    written beside it as ``ditax_sample.json``."""
    path = _ASSETS / STUDENT_DIR / STUDENT_LORA
    if not path.is_file():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the demo model's student is missing from {path.parent}; "
                            "reinstall ditax, or distil it with `make demo-student`")
    return path


def student_settings(load: bool = False, lora=None) -> dict:
    """How the shipped student (or the student ``lora``, a LoRA file with its
    ``ditax_sample.json`` beside it) samples: the pipeline call's keywords
    (``num_inference_steps`` 4, ``guidance_scale`` 1: no classifier-free guidance, ``sigmas``:
    the Euler steps' noise levels before the shift), or with ``load`` the loader's
    (``scheduler="euler"``, ``flow_shift``). A fresh dict each time."""
    from ditax.io.files import read_model_json
    from ditax.pipelines.lora_sample import LOAD_KEYS

    lora = pathlib.Path(lora) if lora else student_lora_path()
    values = read_model_json(lora.parent / "ditax_sample.json", "ditax_sample.json")
    return {k: v for k, v in values.items() if (k in LOAD_KEYS) == load}


def load_student(path=None, lora=None, **kw):
    """The demo model (``path``: default :func:`model_path`) with its 4-step student
    (``lora``: default :func:`student_lora_path`) at strength 1, loaded with the student's
    sampler and shift (:data:`STUDENT_LOAD`, or those beside ``lora``); sample it with
    ``**STUDENT_SAMPLE``. ``kw``: more :func:`~ditax.pipelines.wan.loading.load_pipeline`
    arguments."""
    from ditax.pipelines.wan.loading import load_pipeline

    lora = lora or student_lora_path()
    return load_pipeline(path or model_path(), loras=[(str(lora), 1.0)],
                         **{**student_settings(load=True, lora=lora), **kw})


CAUSAL_DIR = "demo_causal"


def causal_model_path() -> pathlib.Path:
    """The demo model's shipped causal student (issue 59): a ``WanPipeline`` folder whose
    transformer is block-causal (``causal_chunk`` in its config.json) and samples chunk by
    chunk in 4 Euler steps against a KV cache (its ``ditax_sample.json``), distilled by
    Self-Forcing (``make demo-causal``: :mod:`ditax.recipes.demo_causal`); its tokenizer, text
    encoder and VAE are the demo model's (linked). ``--model demo-causal`` names it."""
    path = _ASSETS / CAUSAL_DIR
    if not (path / "model_index.json").is_file() or not (path / "transformer").is_dir():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the demo model's causal student is missing from {path}; "
                            "reinstall ditax, or distil it with `make demo-causal`")
    return path


def flux_model_path() -> pathlib.Path:
    """The shipped small Flux (a diffusers ``FluxPipeline`` folder inside the installed
    package, trained by ``make flux-demo-model``: :mod:`ditax.recipes.flux_demo_model`)."""
    path = _ASSETS / "flux_demo_model"
    if not (path / "model_index.json").is_file():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the small Flux demo model is missing from {path}; reinstall "
                            "ditax, or train it with `make flux-demo-model`")
    return path


def flux_student_lora_path() -> pathlib.Path:
    """The small Flux's shipped 4-step student: a LoRA on :func:`flux_model_path` distilled by
    DMD2 (``make flux-demo-student``: :mod:`ditax.recipes.flux_demo_student`), its sampling
    settings in its metadata and in ``ditax_sample.json`` beside it."""
    path = _ASSETS / "flux_demo_student" / "lora.safetensors"
    if not path.is_file():
        from ditax.errors import ModelNotFound

        raise ModelNotFound(f"the small Flux's student LoRA is missing: {path}; reinstall "
                            "ditax, or distil it with `make flux-demo-student`")
    return path


def _flux_student_sample() -> dict:
    """``FLUX_STUDENT_SAMPLE``: the pipeline call that samples the small Flux with its student
    LoRA (``load_pipeline(flux_model_path(), loras=[(flux_student_lora_path(), 1.0)])``): the
    teacher's size and text length (:data:`FLUX_SAMPLE`), the student's steps, sigmas and
    guidance (the LoRA's ``ditax_sample.json``; its flow shift is the loader's, taken from the
    LoRA at load)."""
    from ditax.io.files import read_model_json
    from ditax.pipelines.lora_sample import LOAD_KEYS

    size = {k: v for k, v in __getattr__("FLUX_SAMPLE").items()
            if k in ("height", "width", "max_sequence_length")}
    own = read_model_json(flux_student_lora_path().parent / "ditax_sample.json",
                          "ditax_sample.json")
    return {**size, **{k: v for k, v in own.items() if k not in LOAD_KEYS}}
