"""``ditax init-random``'s family-independent half: a preset (and ``key=value`` overrides)
resolved to a model config and its family's hook, the folder planned, then written.

A family that can write random pipeline folders names a :class:`RandomFolders` in its
declaration (``FamilySpec(random_folders="module:NAME")``, :mod:`ditax.models.registry`): its
small presets (CPU-size models of each of its folder kinds, a config preset plus overrides)
and ``folder(cfg, options)``, which returns the :class:`Folder` of a run config — its
``model_index.json``, weight :class:`~ditax.recipes.random_parts.Part` s (the transformer's
from :func:`transformer_part`, the others from the family's encoders and VAEs), the small text
files (tokenizers, scheduler, image processor), ``ditax_sample.json`` and what its
``ditax_random.json`` says. Nothing here names a family.

The written folder is what diffusers' ``save_pretrained`` of the family's pipeline writes
(weights under diffusers' / transformers' keys), plus ``ditax_sample.json`` (a quick call),
``ditax_random.json`` (what is random and what was cut) and ``ditax_config.yaml`` (the run
config of the folder's model: ``ditax plan DIR/ditax_config.yaml``, ``ditax train
DIR/ditax_config.yaml init_from=DIR``). It is written hidden beside ``out`` and renamed when
complete.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import time
from typing import Any

from ditax.errors import ConfigError
from ditax.recipes.random_parts import DTYPES, Part, upstream_tensors, write_part

CONFIG_FILE = "ditax_config.yaml"
NOTE_FILE = "ditax_random.json"


@dataclasses.dataclass(frozen=True)
class Preset:
    """A small preset: the config preset it starts from, its ``key=value`` overrides, and
    one line saying what it is."""

    base: str
    overrides: tuple[str, ...] = ()
    what: str = ""


@dataclasses.dataclass(frozen=True)
class Options:
    """How a family sizes the parts beside the transformer. ``small``: a small preset's
    (CPU-size encoders, the small VAE); ``text_layers``: the text encoders' depth (None: the
    family's choice); ``dtype``: the transformer's and text encoders' weights; ``vae``:
    ``"full"`` (the model's real VAE) or ``"small"``; ``size``: ``ditax_sample.json``'s
    ``(height, width, frames)`` (None: the config's sample size)."""

    small: bool
    text_layers: int | None
    dtype: str
    vae: str
    size: tuple[int, int, int] | None = None


@dataclasses.dataclass
class Folder:
    """What a family's hook returns: ``index`` (``model_index.json``), ``parts`` (the weight
    folders, the transformer first), ``files`` (relative path → text: tokenizers, scheduler,
    processor configs), ``sample`` (``ditax_sample.json``) and ``note`` (the family's lines of
    ``ditax_random.json``)."""

    index: dict
    parts: list[Part]
    files: dict[str, str]
    sample: dict
    note: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RandomFolders:
    """A family's random-folder hook: ``presets`` (name → :class:`Preset`) and ``folder``
    (``"module:function"`` or the function ``(cfg, Options) -> Folder``)."""

    family: str
    presets: dict[str, Preset]
    folder: Any

    def build(self, cfg, options: Options) -> Folder:
        from ditax.models.registry import resolve

        return resolve(self.folder)(cfg, options)


def hooks() -> dict[str, RandomFolders]:
    """Every registered family's hook (family name → :class:`RandomFolders`)."""
    from ditax.models import registry

    found = {n: registry.spec(n).random_folders_object() for n in registry.family_names()}
    return {n: h for n, h in found.items() if h is not None}


def small_presets() -> dict[str, tuple[RandomFolders, Preset]]:
    """Every family's small presets (name → ``(hook, preset)``)."""
    return {name: (hook, p) for hook in hooks().values() for name, p in hook.presets.items()}


def resolve_preset(preset: str, overrides=()) -> tuple[Any, RandomFolders, bool]:
    """``(run config, its family's hook, small)`` of ``preset``: a small preset (its base and
    overrides, then ``overrides``), else a config preset or YAML path (``ditax config``)."""
    from ditax.config import load_config
    from ditax.config.loader import preset_names
    from ditax.models import registry

    small = small_presets()
    if preset in small:
        hook, p = small[preset]
        return load_config(p.base, [*p.overrides, *overrides]), hook, True
    if preset not in preset_names() and not pathlib.Path(preset).is_file():
        raise ConfigError(f"preset {preset!r} is neither a small preset ({', '.join(small)}) "
                          f"nor a config preset (ditax config) or YAML file; see ditax "
                          f"init-random --list")
    cfg = load_config(preset, list(overrides))
    family = getattr(cfg.model, "family", registry.DEFAULT_FAMILY)
    hook = registry.spec(family).random_folders_object()
    if hook is None:
        raise ConfigError(f"preset {preset!r} is a {family} model, whose family declares no "
                          f"random folders (FamilySpec.random_folders); use one of "
                          f"{', '.join(small)}")
    return cfg, hook, False


def plan(preset: str, overrides=(), *, text_layers: int | None = None, dtype: str | None = None,
         vae: str | None = None, size=None) -> tuple[Any, Folder]:
    """``(run config, Folder)`` of ``preset`` (nothing written, no weights made). Small
    presets default to float32 weights and the small VAE; the others to bfloat16 and the
    model's own VAE."""
    if text_layers is not None and text_layers < 1:
        raise ConfigError(f"--text-layers {text_layers} must be >= 1")
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if vae not in (None, "full", "small"):
        raise ConfigError(f"--vae {vae!r} is not one of full, small")
    cfg, hook, small = resolve_preset(preset, overrides)
    options = Options(small, text_layers, dtype or ("float32" if small else "bfloat16"),
                      vae or ("small" if small else "full"), size)
    return cfg, hook.build(cfg, options)


def transformer_part(cfg, config: dict, dtype: str) -> Part:
    """The transformer of run config ``cfg`` at its real size under diffusers' keys: the
    family's own table (``ModelFamily.weight_table``) over its abstract module, ``config`` its
    ``config.json``."""
    from ditax.models.base import model_family

    family = model_family(cfg.model)
    return Part("transformer", "diffusion_pytorch_model", config,
                upstream_tensors(family.weight_table(), family.abstract(None)), dtype)


def sample_size(cfg, size) -> tuple[int, int, int]:
    """``ditax_sample.json``'s ``(height, width, frames)``: ``size``, else the config's."""
    s = cfg.sample
    return tuple(size) if size else (s.height, s.width, s.num_frames)


def write(out, preset: str, cfg, folder: Folder, *, seed: int = 0, threads: int | None = None,
          say=print) -> pathlib.Path:
    """Write ``folder`` (planned by :func:`plan` for ``cfg``) as the pipeline folder ``out``
    (new or empty); returns it."""
    import yaml

    from ditax.config.loader import to_dict
    from ditax.io.outputs import atomic_folder
    from ditax.models.common.single_files import check_out
    from ditax.pipelines.family import pipelines_of
    from ditax.pipelines.sample_defaults import write_sample_defaults

    from ditax.models.registry import DEFAULT_FAMILY

    out = check_out(out, None)
    family = getattr(cfg.model, "family", DEFAULT_FAMILY)
    t0 = time.perf_counter()
    threads = threads or os.cpu_count() or 1
    with atomic_folder(out) as tmp, concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for part in folder.parts:
            write_part(tmp, part, seed, pool, ahead=2 * threads)
            say(f"{part.name}: {part.params:,} parameters, {part.nbytes / 1e9:.2f} GB "
                f"({part.dtype}) in {time.perf_counter() - t0:.1f} s")
        for rel, text in folder.files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        (tmp / "model_index.json").write_text(json.dumps(folder.index, indent=2))
        write_sample_defaults(tmp, folder.sample, pipelines_of(family).sample_file_rules())
        (tmp / NOTE_FILE).write_text(json.dumps(note(preset, folder, seed), indent=2))
        (tmp / CONFIG_FILE).write_text(
            f"# the run config of this folder's model (ditax init-random {preset}): ditax plan "
            f"{out.name}/{CONFIG_FILE}; ditax train {out.name}/{CONFIG_FILE} init_from="
            f"{out.name}\n" + yaml.safe_dump(to_dict(cfg), sort_keys=False))
    say(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    return out


def note(preset: str, folder: Folder, seed: int) -> dict:
    """``ditax_random.json``: what the folder is, and where it differs from the real model."""
    return {"what": f"random weights in the shape of {preset} (ditax init-random): for trying "
                    f"the commands and for speed and memory measurements; the outputs are "
                    f"noise",
            "preset": preset, "seed": seed,
            "init": "uniform, deviation 1/sqrt(fan_in); biases 0, norm gains and other "
                    "vectors 1",
            "parameters": {p.name: p.params for p in folder.parts}, **folder.note}


__all__ = ["CONFIG_FILE", "Folder", "NOTE_FILE", "Options", "Preset", "RandomFolders", "hooks",
           "note", "plan", "resolve_preset", "sample_size", "small_presets", "transformer_part",
           "write"]
