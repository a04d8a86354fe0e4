"""The pipelines of one model family, as the shared entry points see them.

``ditax generate``, ``ditax calibrate-cache`` and the ``sample`` config section know no family:
they ask the family of a pipeline folder for what is its own —

- :attr:`PipelineFamily.sample_defaults`: the values a call uses where neither the caller nor
  the folder gives one (sizes, frames, steps, guidance, text tokens, fps);
- :attr:`PipelineFamily.sample_presets`: named bundles of ``sample`` fields
  (``sample.preset=NAME``);
- :meth:`PipelineFamily.request_defaults`: those defaults with a folder's own file over them;
- :meth:`PipelineFamily.check_request`: the request checks that need no model;
- :meth:`PipelineFamily.preflight`: the checks of a folder against a request before any weights
  are read (its images, its grid, the attention backend with its head dim);
- :meth:`PipelineFamily.load`: the loaded pipeline.

Discovery follows the one rule of :mod:`ditax.models.registry`: a folder's
``model_index.json`` ``_class_name`` names the family (:func:`~ditax.models.registry.spec_for_class`;
none: the default family), and the family's one declaration (its
:class:`~ditax.models.registry.FamilySpec`) names its pipelines (``pipelines=``).
:func:`register_pipelines` is a thin wrapper that fills that field (a family defined in a test).

Light on purpose (no JAX): the config loader reads the default family's defaults through it.
"""

from __future__ import annotations

import pathlib
from typing import Any, ClassVar

from ditax.errors import ConfigError, ModelNotFound
from ditax.models import registry


class PipelineFamily:
    """One family's pipelines; subclass it, set the class attributes, and override what the
    family has (each default below says what a family without it gets)."""

    name: ClassVar[str]
    # the main output's kind: "video" (``ditax generate`` writes an mp4) or "image" (a PNG)
    makes: ClassVar[str] = "video"
    # further outputs of a call, by kind (e.g. "audio" beside a video): the pipeline's call
    # returns ``{makes: main, kind: array, ...}``, each extra written beside the main output
    # (:func:`ditax.io.outputs.write_extras`)
    outputs: ClassVar[tuple[str, ...]] = ()
    # those of ``outputs`` that go INTO the main file rather than beside it (a sound track,
    # an :class:`~ditax.io.audio.AudioTrack`, muxed into the mp4): no file of their own
    muxed: ClassVar[tuple[str, ...]] = ()
    sample_defaults: ClassVar[dict[str, Any]] = {}
    sample_presets: ClassVar[dict[str, dict[str, Any]]] = {}
    # the family's own request fields (:class:`ditax.pipelines.request.Field`), beside the
    # common ones: ``ditax generate`` shows each as a flag, ``ditax serve`` takes it as JSON
    fields: ClassVar[tuple] = ()
    # the family's inputs beyond its fields (files and their knobs: images, videos), declared
    # as data (:class:`ditax.pipelines.inputs.Input`); ``ditax generate`` shows each as a flag
    inputs: ClassVar[tuple] = ()
    # the names of the request's mapping this family reads beyond its fields (its ``inputs``
    # and the output options it takes: ``fps``, ``frames_dir``...); any other given one is
    # refused naming the family
    cli_inputs: ClassVar[tuple[str, ...]] = ()

    # the keys a folder's ditax_sample.json may hold (None: every key of sample_defaults);
    # their rules: ditax.pipelines.sample_defaults
    sample_file_keys: ClassVar[tuple[str, ...] | None] = None
    # the sampling settings a LoRA file may carry for these pipelines (its ``ditax_sample``
    # metadata: :mod:`ditax.pipelines.lora_sample`); none by default
    lora_sample_keys: ClassVar[tuple[str, ...]] = ()
    # whether the pipelines decode with the rows split over the mesh (vae_parallel=True;
    # ditax.models.vae.parallel has their VAE)
    parallel_vae: ClassVar[bool] = False
    # whether ``image`` is one or several reference images whose sizes shape the program (their
    # tokens join the sequence: FLUX.2): ditax serve then takes a list of them and batches only
    # requests whose images have the same sizes; else ``image`` is one picture the pipeline
    # resizes to the output (Wan's first frame)
    reference_images: ClassVar[bool] = False
    # (whether the pipelines take step caching is the family's capability "step_cache",
    # declared in its FamilySpec: ditax.models.registry.require)

    def text_encoders(self, pipe) -> list:
        """The loaded pipeline ``pipe``'s encoder modules (text and image) that
        ``text_offload="host"`` keeps in host memory (:func:`ditax.nn.offload.keep_on_host`);
        by default its ``text_encoder``, ``text_encoder_2`` and ``image_encoder``."""
        names = ("text_encoder", "text_encoder_2", "image_encoder")
        return [m for m in (getattr(pipe, n, None) for n in names) if m is not None]

    def sample_file_rules(self) -> dict:
        """``{key: (kind, rule)}`` of the keys this family's ``ditax_sample.json`` may hold
        (:attr:`sample_file_keys`; :func:`ditax.pipelines.sample_defaults.rules_for`), and
        ``sigmas`` where the pipelines take them (a few-step student's folder: its Euler
        sigmas, used with their step count)."""
        from ditax.pipelines.sample_defaults import SAMPLER_RULES, rules_for

        keys = self.sample_defaults if self.sample_file_keys is None else self.sample_file_keys
        rules = rules_for(keys, self.sample_defaults)
        if "sigmas" in self.lora_sample_keys:
            rules["sigmas"] = SAMPLER_RULES["sigmas"]
        return rules

    def lora_sample_rules(self) -> dict:
        """``{key: (kind, rule)}`` of :attr:`lora_sample_keys`
        (:data:`ditax.pipelines.sample_defaults.RULES` and ``SAMPLER_RULES``)."""
        from ditax.pipelines.sample_defaults import RULES, SAMPLER_RULES

        rules = {**RULES, **SAMPLER_RULES}
        return {k: rules[k] for k in self.lora_sample_keys}

    def folder_defaults(self, root) -> dict:
        """The checked values of folder ``root``'s ``ditax_sample.json`` (``{}``: none), read
        before any weights (:class:`~ditax.errors.PipelineLoadError` naming the file and the
        key). A family may add checks that need no weights (Wan: its size grid)."""
        from ditax.pipelines.sample_defaults import read_sample_defaults

        return read_sample_defaults(root, self.sample_file_rules())

    def request_defaults(self, root: pathlib.Path | None, sample, chosen: set) -> dict:
        """Per key of :attr:`sample_defaults`: the ``sample`` config's value where the user chose
        it (``chosen``: ``sample.KEY=`` or set by ``sample.preset``), else the folder's
        ``ditax_sample.json`` (:meth:`folder_defaults`), else the family's default.
        ``root``: the resolved folder (None: not found yet; reported by :meth:`preflight`)."""
        own = {} if root is None else self.folder_defaults(root)
        return {k: getattr(sample, k) if k in chosen and hasattr(sample, k) else own.get(k, v)
                for k, v in self.sample_defaults.items()}

    def read_inputs(self, given, call: dict, sample) -> dict:
        """The pipeline call with the family's inputs of ``given`` (the request's plain mapping,
        by name: :attr:`inputs`) read into it (files decoded and checked; ``sample``: the
        config's sample section); unchanged by default."""
        return call

    def sample_options(self, given, sample, chosen: set, defaults: dict,
                       call: dict) -> tuple[dict, dict]:
        """``(call, load)``: the family's own keyword arguments of its pipeline call and of its
        loader beyond the request fields, from the config's ``sample`` section (``chosen``: the
        keys the user set), the request's ``defaults``, the request's mapping ``given`` (its
        inputs) and the ``call`` so far; none by default. (The step cache's arguments are the
        generic loop's: added for a family that declares ``step_cache``.)"""
        return {}, {}

    def check_request(self, prompt, height, width, num_frames=None, num_inference_steps=None,
                      guidance_scale=None, guidance_scale_2=None, negative_prompt=None,
                      seed=0, **fields) -> None:
        """Raise :class:`~ditax.errors.RequestError` for a request no model of the family takes
        (``fields``: the values of the family's own request fields, already type-checked)."""

    def preflight(self, root: pathlib.Path, load: dict, call: dict | None = None,
                  mesh=None) -> None:
        """Check folder ``root`` against the load arguments (``load``: path, dtype, attention,
        model overrides) and the call (``call``; None: only the folder and the attention
        backend), before any weights are read."""

    def load(self, path, **kwargs):
        """The loaded pipeline of folder ``path`` (``ditax.load_pipeline``'s arguments)."""
        raise ConfigError(f"model family {self.name!r} has no pipelines to load {path}")


def register_pipelines(name: str, pipelines) -> None:
    """Thin wrapper kept for tests and families outside ditax: fill the ``pipelines`` part of
    family ``name``'s one declaration (:func:`ditax.models.registry.update`) with ``pipelines``
    (a :class:`PipelineFamily` subclass, or its ``"module:Name"``); a second call replaces the
    first. A family's own ``FamilySpec(pipelines=...)`` is the usual way."""
    registry.update(name, pipelines=pipelines)


def pipelines_of(name: str) -> PipelineFamily:
    """The pipelines of family ``name``, as its spec names them (:func:`ditax.models.registry.spec`:
    imported on first use); :class:`ConfigError` when the family declares none."""
    cls = registry.spec(name).pipelines_class()
    if cls is None:
        raise ConfigError(f"model family {name!r} has no pipelines (its FamilySpec names no "
                          f"pipelines=)")
    return cls()


def pipeline_class(root: pathlib.Path) -> str | None:
    """The ``_class_name`` of pipeline folder ``root``'s ``model_index.json`` (None: none)."""
    from ditax.io.files import read_model_json

    index = read_model_json(pathlib.Path(root) / "model_index.json", "model_index.json")
    cls = index.get("_class_name") if isinstance(index, dict) else None
    return None if cls is None else str(cls)


def family_name(root: pathlib.Path) -> str:
    """The family of pipeline folder ``root``, by its ``model_index.json`` ``_class_name``
    (none: the default family); :class:`ModelNotFound` for a class no family's pipelines
    read, naming the file and the classes ditax runs."""
    cls = pipeline_class(root)
    if cls is None:
        return registry.DEFAULT_FAMILY
    for name in registry.family_names():
        if cls in registry.spec(name).pipeline_classes:
            return name
    runs = sorted({c for n in registry.family_names() for c in registry.spec(n).pipeline_classes})
    raise ModelNotFound(f"_class_name {cls!r} in {pathlib.Path(root) / 'model_index.json'} is "
                        f"not a pipeline ditax runs; it runs {', '.join(runs)}")


def _what_it_is(p: pathlib.Path) -> str | None:
    """Why the existing path ``p`` is no pipeline folder, as ``"is ...; <fix>"``; None when it
    has a ``model_index.json``."""
    if p.is_file():
        return ("is a file, not a pipeline folder (model_index.json beside its component "
                "folders); pass the folder (a single-file checkpoint loads with "
                "ditax.load_transformer(FILE, config=...))")
    if (p / "model_index.json").is_file():
        return None
    run = [n for n in ("config.yaml", "checkpoints") if (p / n).exists()]
    if run:
        made = [f.name for f in p.glob("lora*.safetensors")]
        fix = (f"pass the pipeline folder it was trained from, with --lora {p / made[0]}"
               if made else f"write its checkpoint as a pipeline folder with ditax export {p} "
               f"--out FOLDER, or pass the pipeline folder it was trained from")
        shown = ", ".join(n + ("/" if (p / n).is_dir() else "") for n in run)
        return (f"is a training run folder ({shown}), not a pipeline folder "
                f"(model_index.json); {fix}")
    if (p / "config.json").is_file():
        from ditax.io.files import read_model_json

        cfg = read_model_json(p / "config.json", "config.json")
        cls = cfg.get("_class_name", "model") if isinstance(cfg, dict) else "model"
        up = p.parent if (p.parent / "model_index.json").is_file() else None
        fix = (f"pass the pipeline folder that holds it, {up}" if up is not None else
               "pass the diffusers pipeline folder that holds it (model_index.json)")
        return (f"is a {cls} folder (config.json), one component, not a pipeline folder "
                f"(model_index.json); {fix}")
    return ("has no model_index.json, so it is no diffusers pipeline folder; pass a folder "
            "written by a diffusers pipeline's save_pretrained (model_index.json, "
            "transformer/, vae/, ...) or a hub id")


def model_folder(path, what: str = "model path") -> pathlib.Path:
    """The pipeline folder ``path`` names (a local folder with ``model_index.json``, or a hub
    id fetched or read from the cache), checked to be one before any family rule: a missing
    path, an uncached hub id, a training run folder, a component folder, a file or a pipeline
    class no family runs is one :class:`ModelNotFound` line naming ``what`` (``"--model"``),
    the path, what it is or lacks, and the fix."""
    from ditax.io.files import path_arg
    from ditax.io.hub import split_hub_id

    p = path_arg(path, "model path", ModelNotFound, "a pipeline folder or a hub id").expanduser()
    if p.exists():
        why = _what_it_is(p)
        if why is not None:
            raise ModelNotFound(f"{what} {path} {why}")
        root = p
    else:
        if split_hub_id(path)[0] is None:
            raise ModelNotFound(f"{what} {path}: no such folder (nor a hub id like "
                                f"'Wan-AI/Wan2.1-T2V-1.3B-Diffusers'); pass a diffusers "
                                f"pipeline folder (model_index.json) or a hub id")
        try:
            root = resolve(path)
        except ModelNotFound as e:
            raise ModelNotFound(f"{what} {path}: no such folder, and as a hub id: {e}") from None
    family_name(root)             # a class no family runs: named here, before its rules
    return root


def resolve(path) -> pathlib.Path:
    """The local pipeline folder of ``path`` (a folder with ``model_index.json``, or a hub id
    fetched when online); :class:`ModelNotFound` otherwise."""
    from ditax.io.hub import resolve_folder

    return resolve_folder(path, None, required=("model_index.json",))


def folder_pipelines(path, strict: bool = False) -> tuple[pathlib.Path | None, PipelineFamily]:
    """``(root, pipelines)`` of a pipeline folder or hub id, reading only its
    ``model_index.json``. ``strict``: a path that is no pipeline folder is
    :func:`model_folder`'s one-line :class:`ModelNotFound`; else ``(None, the default
    family's)`` (``ditax.load_pipeline``: the default loader names what it takes)."""
    if strict:
        root = model_folder(path)
        return root, pipelines_of(family_name(root))
    try:
        root = resolve(path)
        return root, pipelines_of(family_name(root))
    except ModelNotFound:
        return None, pipelines_of(registry.DEFAULT_FAMILY)


def preflight(path, load: dict, call: dict | None = None, mesh=None) -> pathlib.Path:
    """The folder at ``path`` exists (:class:`ModelNotFound`), a family reads it, and that
    family's :meth:`PipelineFamily.preflight` passes; returns the resolved folder."""
    root = resolve(path)
    pipelines_of(family_name(root)).preflight(root, load, call, mesh)
    return root


def known_pipelines() -> list[tuple[str, PipelineFamily]]:
    """``(name, pipelines)`` of every registered family that has pipelines (the built-in ones
    discovered, those registered in this process too)."""
    out = []
    for name in registry.family_names():
        try:
            out.append((name, pipelines_of(name)))
        except ConfigError:        # a family without pipelines (training only)
            continue
    return out


def sample_defaults(name: str = registry.DEFAULT_FAMILY) -> dict[str, Any]:
    """Family ``name``'s :attr:`PipelineFamily.sample_defaults` (a copy)."""
    return dict(pipelines_of(name).sample_defaults)


def sample_presets(name: str = registry.DEFAULT_FAMILY) -> dict[str, dict[str, Any]]:
    """Family ``name``'s :attr:`PipelineFamily.sample_presets` (``{}``: none)."""
    return dict(pipelines_of(name).sample_presets)


__all__ = ["PipelineFamily", "family_name", "folder_pipelines", "known_pipelines", "pipelines_of",
           "preflight", "model_folder", "pipeline_class",
           "register_pipelines", "resolve", "sample_defaults", "sample_presets"]
