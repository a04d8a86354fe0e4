"""Configuration: frozen dataclasses, YAML presets, ``key=value`` overrides, one validator.

Config is data (DESIGN rule 1): one dataclass per concern, composed into :class:`Config`.
``load_config("tiny", ["mesh.fsdp=8", "attention.backend=ulysses"])`` reads a preset (or a
YAML path), applies dotted overrides with typed coercion, and returns a frozen object.
:func:`validate` checks everything that can be checked before tracing and raises
:class:`ConfigError` with the value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import pathlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from ditax.attention.config import AttentionConfig
from ditax.errors import ConfigError, check_choice
from ditax.models.base import model_family
from ditax.models.wan.config import ModelConfig
from ditax.parallel.mesh import MeshConfig, check_batch, resolve_mesh_shape

PRESET_DIR = pathlib.Path(__file__).parent / "configs"


@dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    schedule: str = "constant"   # constant | cosine | linear
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    decay_steps: int = 0         # end of cosine/linear decay; 0 = the run's `steps`


@dataclass(frozen=True)
class FlowConfig:
    """Rectified-flow objective (Wan recipe)."""

    timestep_sampler: str = "uniform"  # uniform | logit_normal
    logit_mean: float = 0.0
    logit_std: float = 1.0
    shift: float = 1.0                 # sigma' = s*sigma / (1 + (s-1)*sigma)
    weighting: str = "none"            # none | bell (well defined at batch 1)


@dataclass(frozen=True)
class DataConfig:
    source: str = "synthetic"          # synthetic | path to a dataset written by `ditax preprocess`
    num_frames: int = 5                # synthetic: pixel frames (latent F = (n-1)/4 + 1)
    height: int = 64                   # synthetic: pixel height
    width: int = 64
    text_len: int = 16                 # synthetic: text tokens
    shuffle: bool = True
    num_workers: int = 0


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 100
    keep: int = 3
    async_save: bool = True


@dataclass(frozen=True)
class SampleConfig:
    height: int = 480
    width: int = 832
    num_frames: int = 81
    num_inference_steps: int = 50
    guidance_scale: float = 5.0
    guidance_scale_2: Optional[float] = None
    cfg_mode: str = "batched"          # batched | sequential
    scheduler: str = "unipc"           # unipc | euler
    flow_shift: Optional[float] = None  # None = from the scheduler config
    max_sequence_length: int = 512
    vae_tiling: bool = False


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    name: str = "custom"
    steps: int = 100
    batch_size: int = 1               # global batch
    output_dir: str = "out/run"
    seed: int = 0
    log_every: int = 1
    init_from: Optional[str] = None   # diffusers folder to initialise weights from


# ----------------------------------------------------------------------------------------------
# building from dicts / YAML / overrides


def _is_dataclass_type(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp, key: str):
    """Coerce a YAML / command-line value to the annotated field type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"{key}={value!r}: expected a boolean (true/false)")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}={value!r}: expected an integer")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={value!r}: expected an integer") from None
        if f != int(f):
            raise ConfigError(f"{key}={value!r}: expected an integer, got a fraction")
        return int(f)
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={value!r}: expected a number") from None
    if tp is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{key}={value!r}: expected a string")
        return str(value)
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.replace("(", "").replace(")", "").replace("[", "")
                     .replace("]", "").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r}: expected a list like 1,2,2")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], key) for v in value)
        if len(value) != len(args):
            raise ConfigError(f"{key}={value!r}: expected {len(args)} values")
        return tuple(_coerce(v, a, key) for v, a in zip(value, args))
    return value


def _all_keys(cls, prefix="") -> list[str]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_dataclass_type(tp):
            out += _all_keys(tp, prefix + f.name + ".")
        else:
            out.append(prefix + f.name)
    return out


def _unknown(key: str, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    if not close:  # also match on the last component (e.g. "fsdp" -> "mesh.fsdp")
        last = key.split(".")[-1]
        close = [v for v in valid if v.split(".")[-1] == last][:3]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def from_dict(cls, d: dict, prefix: str = ""):
    """Build dataclass ``cls`` from a nested dict, coercing types; unknown keys are errors."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(d).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {}
    for k, v in d.items():
        if k not in names:
            raise _unknown(prefix + k, _all_keys(Config))
        tp = hints[k]
        if _is_dataclass_type(tp):
            kw[k] = from_dict(tp, v, prefix + k + ".")
        else:
            kw[k] = _coerce(v, tp, prefix + k)
    return cls(**kw)


def to_dict(cfg) -> dict:
    d = dataclasses.asdict(cfg)

    def fix(x):
        if isinstance(x, dict):
            return {k: fix(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return list(x)
        return x

    return fix(d)


def _set_dotted(d: dict, key: str, value: Any):
    parts = key.split(".")
    node = d
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {p!r} is not a section")
    node[parts[-1]] = value


def parse_overrides(overrides: list[str] | None) -> dict:
    """``["mesh.fsdp=8", "model.remat=full"]`` → nested dict (values still strings / YAML scalars)."""
    out: dict = {}
    valid = _all_keys(Config)
    sections = {k.split(".")[0] for k in valid if "." in k}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. mesh.fsdp=8)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key not in valid:
            if key in sections:
                raise ConfigError(f"override {key!r} names a section; set one of its keys, "
                                  f"e.g. {[v for v in valid if v.startswith(key + '.')][:3]}")
            raise _unknown(key, valid)
        try:
            value = yaml.safe_load(raw) if raw.strip() != "" else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(out, key, value)
    return out


def _merge(base: dict, upd: dict) -> dict:
    out = dict(base)
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_yaml(name_or_path: str) -> dict:
    p = pathlib.Path(name_or_path)
    if not p.is_file() and (PRESET_DIR / f"{name_or_path}.yaml").is_file():
        p = PRESET_DIR / f"{name_or_path}.yaml"
    if not p.exists():
        raise ConfigError(f"config {name_or_path!r} is neither a YAML file nor a preset; "
                          f"presets: {', '.join(preset_names())}")
    with open(p) as f:
        d = yaml.safe_load(f) or {}
    base = d.pop("base", None)
    if base:
        d = _merge(load_yaml(base), d)
    return d


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Load a preset name or YAML path, apply ``key=value`` overrides, return a frozen Config."""
    d = load_yaml(name_or_path) if name_or_path else {}
    d = _merge(d, parse_overrides(overrides))
    return from_dict(Config, d)


def replace(cfg, **changes):
    """``dataclasses.replace`` that also accepts dotted keys: replace(cfg, **{"mesh.fsdp": 8})."""
    nested: dict = {}
    flat = {}
    for k, v in changes.items():
        if "." in k:
            head, rest = k.split(".", 1)
            nested.setdefault(head, {})[rest] = v
        else:
            flat[k] = v
    for head, sub in nested.items():
        flat[head] = replace(getattr(cfg, head), **sub)
    return dataclasses.replace(cfg, **flat)


# ----------------------------------------------------------------------------------------------
# validation




def validate(cfg: Config, num_devices: int | None = None, *, training: bool = False) -> Config:
    """Check every value that can be checked before tracing; each concern's owner holds its
    rules (model, attention, mesh). Returns ``cfg`` unchanged."""
    sizes = None if num_devices is None else resolve_mesh_shape(cfg.mesh, num_devices)
    model_family(cfg.model, cfg.attention).check(sizes)   # model + attention rules
    o = cfg.optim
    check_choice("optim.schedule", o.schedule, ("constant", "cosine", "linear"))
    if o.learning_rate <= 0:
        raise ConfigError(f"optim.learning_rate={o.learning_rate} must be > 0")
    if o.warmup_steps < 0:
        raise ConfigError(f"optim.warmup_steps={o.warmup_steps} must be >= 0")
    check_choice("flow.timestep_sampler", cfg.flow.timestep_sampler, ("uniform", "logit_normal"))
    check_choice("flow.weighting", cfg.flow.weighting, ("none", "bell"))
    if cfg.flow.shift <= 0:
        raise ConfigError(f"flow.shift={cfg.flow.shift} must be > 0")
    check_choice("sample.cfg_mode", cfg.sample.cfg_mode, ("batched", "sequential"))
    check_choice("sample.scheduler", cfg.sample.scheduler, ("unipc", "euler"))
    if cfg.steps < 0:
        raise ConfigError(f"steps={cfg.steps} must be >= 0")
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} must be >= 1")
    if training and sizes is not None:
        check_batch(cfg.batch_size, sizes)
    return cfg
