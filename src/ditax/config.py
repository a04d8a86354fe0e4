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

PRESET_DIR = pathlib.Path(__file__).parent / "configs"

DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "save_dots", "save_dots_no_batch", "save_attn_out")
ATTENTION_BACKENDS = ("auto", "reference", "xla", "blockwise", "splash", "flash", "cudnn", "te",
                      "ulysses", "ring", "ulysses_ring")
PARALLEL_BACKENDS = ("ulysses", "ring", "ulysses_ring")
LOCAL_BACKENDS = ("reference", "xla", "blockwise", "splash", "flash", "cudnn", "te")
OUT_A2A_MODES = ("flat", "chunked", "shard_major")
MESH_AXES = ("data", "fsdp", "context", "tensor")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the value and the fix."""


@dataclass(frozen=True)
class ModelConfig:
    """Wan transformer shape (diffusers ``WanTransformer3DModel`` config names) and numerics."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 12
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 8960
    num_layers: int = 30
    cross_attn_norm: bool = True
    qk_norm: str = "rms_norm_across_heads"
    eps: float = 1e-6
    rope_max_seq_len: int = 1024
    param_dtype: str = "float32"   # storage dtype of the weights
    dtype: str = "float32"         # compute dtype of matmuls / attention
    remat: str = "none"            # none | full | save_dots | save_dots_no_batch | save_attn_out
    scan_layers: bool = True

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def from_diffusers(cls, cfg: dict, **overrides) -> "ModelConfig":
        """Build from a diffusers ``config.json`` dict (unknown keys ignored, I2V keys refused)."""
        if cfg.get("image_dim") is not None or cfg.get("added_kv_proj_dim") is not None:
            raise ConfigError(
                "this transformer config has image_dim/added_kv_proj_dim set (an image-to-video "
                "model); ditax implements text-to-video Wan only. Use a T2V checkpoint.")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in cfg.items() if k in names}
        if "patch_size" in kw:
            kw["patch_size"] = tuple(kw["patch_size"])
        if kw.get("qk_norm") is None and "qk_norm" in cfg:
            raise ConfigError("qk_norm=None is not supported; Wan uses 'rms_norm_across_heads'")
        kw.update(overrides)
        return cls(**kw)


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh ``(data, fsdp, context, tensor)``; one size may be -1 (= the rest).

    data: pure replicas. fsdp: batch-sharded ZeRO-3 (params sharded, batch sharded).
    context: sequence-sharded (Ulysses / ring). tensor: heads and MLP columns.
    """

    data: int = 1
    fsdp: int = -1
    context: int = 1
    tensor: int = 1
    # Multi-host (jax.distributed). None = single process, or auto-detected on TPU/SLURM.
    coordinator_address: Optional[str] = None
    num_processes: Optional[int] = None
    process_id: Optional[int] = None


@dataclass(frozen=True)
class AttentionConfig:
    """Attention backends for self- and cross-attention, and sequence-parallel options."""

    backend: str = "xla"                 # self-attention backend (see ATTENTION_BACKENDS)
    cross_backend: Optional[str] = None  # cross-attention; None = the local kernel of `backend`
    local: str = "xla"                   # local kernel inside ulysses / ring
    out_a2a: str = "flat"                # Ulysses output exchange: flat | chunked | shard_major
    ulysses_shards: int = 0              # ulysses_ring: Ulysses group size (0 = all of context)
    block_q: int = 128                   # flash / splash / blockwise query block
    block_kv: int = 128                  # flash / splash / blockwise key block
    short_cross_backend: Optional[str] = None  # explicit routing for short text K/V (opt-in)
    te_shardy: Optional[bool] = None     # te only: None = keep jax's partitioner; false = GSPMD


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


def _check_enum(key: str, value, allowed):
    if value not in allowed:
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(map(str, allowed))}{hint}")


def resolve_mesh_shape(mesh: MeshConfig, num_devices: int) -> dict[str, int]:
    """Sizes of the four mesh axes with a -1 resolved; errors name the numbers and the fix."""
    sizes = {a: getattr(mesh, a) for a in MESH_AXES}
    bad = {a: s for a, s in sizes.items() if s == 0 or s < -1}
    if bad:
        raise ConfigError(f"mesh sizes must be >= 1 or -1 (= the remaining devices); got {bad}")
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise ConfigError(f"at most one mesh axis may be -1; got {free} = -1. Set all but one.")
    fixed = 1
    for a, s in sizes.items():
        if s != -1:
            fixed *= s
    if free:
        if num_devices % fixed:
            raise ConfigError(
                f"mesh {sizes}: the fixed axes multiply to {fixed}, which does not divide the "
                f"{num_devices} devices; choose sizes whose product divides {num_devices}")
        sizes[free[0]] = num_devices // fixed
    prod = 1
    for s in sizes.values():
        prod *= s
    if prod != num_devices:
        raise ConfigError(
            f"mesh data*fsdp*context*tensor = {'*'.join(str(sizes[a]) for a in MESH_AXES)} = "
            f"{prod}, but there are {num_devices} devices; make the product {num_devices} "
            f"or set one axis to -1")
    return sizes


def validate(cfg: Config, num_devices: int | None = None, *, training: bool = False) -> Config:
    """Check every value that can be checked before tracing. Returns ``cfg`` unchanged."""
    m = cfg.model
    _check_enum("model.param_dtype", m.param_dtype, DTYPES)
    _check_enum("model.dtype", m.dtype, DTYPES)
    _check_enum("model.remat", m.remat, REMAT_POLICIES)
    if m.qk_norm != "rms_norm_across_heads":
        raise ConfigError(f"model.qk_norm={m.qk_norm!r}: only 'rms_norm_across_heads' (Wan) exists")
    for k in ("num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
              "text_dim", "freq_dim", "ffn_dim", "num_layers"):
        if getattr(m, k) < 1:
            raise ConfigError(f"model.{k}={getattr(m, k)} must be >= 1")
    if m.attention_head_dim % 2:
        raise ConfigError(f"model.attention_head_dim={m.attention_head_dim} must be even (RoPE pairs)")
    if m.freq_dim % 2:
        raise ConfigError(f"model.freq_dim={m.freq_dim} must be even (sin/cos halves)")
    if any(p < 1 for p in m.patch_size):
        raise ConfigError(f"model.patch_size={m.patch_size} must be positive")

    a = cfg.attention
    _check_enum("attention.backend", a.backend, ATTENTION_BACKENDS)
    if a.cross_backend is not None:
        _check_enum("attention.cross_backend", a.cross_backend,
                    tuple(b for b in ATTENTION_BACKENDS if b not in PARALLEL_BACKENDS))
    if a.short_cross_backend is not None:
        _check_enum("attention.short_cross_backend", a.short_cross_backend, LOCAL_BACKENDS)
    _check_enum("attention.local", a.local, LOCAL_BACKENDS)
    _check_enum("attention.out_a2a", a.out_a2a, OUT_A2A_MODES)
    if a.out_a2a != "flat" and a.backend not in ("ulysses", "ulysses_ring"):
        raise ConfigError(
            f"attention.out_a2a={a.out_a2a!r} applies to the Ulysses output exchange, but "
            f"attention.backend={a.backend!r} has none; use backend=ulysses or ulysses_ring, "
            f"or out_a2a=flat")
    if a.ulysses_shards and a.backend != "ulysses_ring":
        raise ConfigError(f"attention.ulysses_shards={a.ulysses_shards} only applies to "
                          f"backend=ulysses_ring (got {a.backend!r}); remove it or switch backend")
    if a.ulysses_shards < 0:
        raise ConfigError(f"attention.ulysses_shards={a.ulysses_shards} must be >= 0")
    for k in ("block_q", "block_kv"):
        if getattr(a, k) < 1:
            raise ConfigError(f"attention.{k}={getattr(a, k)} must be >= 1")

    o = cfg.optim
    _check_enum("optim.schedule", o.schedule, ("constant", "cosine", "linear"))
    if o.learning_rate <= 0:
        raise ConfigError(f"optim.learning_rate={o.learning_rate} must be > 0")
    if o.warmup_steps < 0:
        raise ConfigError(f"optim.warmup_steps={o.warmup_steps} must be >= 0")
    _check_enum("flow.timestep_sampler", cfg.flow.timestep_sampler, ("uniform", "logit_normal"))
    _check_enum("flow.weighting", cfg.flow.weighting, ("none", "bell"))
    if cfg.flow.shift <= 0:
        raise ConfigError(f"flow.shift={cfg.flow.shift} must be > 0")
    _check_enum("sample.cfg_mode", cfg.sample.cfg_mode, ("batched", "sequential"))
    _check_enum("sample.scheduler", cfg.sample.scheduler, ("unipc", "euler"))
    if cfg.steps < 0:
        raise ConfigError(f"steps={cfg.steps} must be >= 0")
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} must be >= 1")

    if num_devices is not None:
        sizes = resolve_mesh_shape(cfg.mesh, num_devices)
        if m.num_attention_heads % sizes["tensor"]:
            raise ConfigError(
                f"model.num_attention_heads={m.num_attention_heads} is not divisible by "
                f"mesh.tensor={sizes['tensor']}; pick a tensor size that divides the heads")
        if m.ffn_dim % sizes["tensor"]:
            raise ConfigError(f"model.ffn_dim={m.ffn_dim} is not divisible by "
                              f"mesh.tensor={sizes['tensor']}")
        if training:
            bsh = sizes["data"] * sizes["fsdp"]
            if cfg.batch_size % bsh:
                raise ConfigError(
                    f"batch_size={cfg.batch_size} is not divisible by mesh.data*mesh.fsdp = "
                    f"{sizes['data']}*{sizes['fsdp']} = {bsh}; use a batch size that is a "
                    f"multiple of {bsh} or shrink data/fsdp")
        if a.backend in PARALLEL_BACKENDS:
            heads_local = m.num_attention_heads // sizes["tensor"]
            if a.backend == "ulysses":
                u = sizes["context"]
            elif a.backend == "ulysses_ring":
                u = a.ulysses_shards or sizes["context"]
                if sizes["context"] % u:
                    raise ConfigError(
                        f"attention.ulysses_shards={u} does not divide mesh.context="
                        f"{sizes['context']}; pick a divisor of {sizes['context']}")
            else:
                u = 1
            if heads_local % u:
                raise ConfigError(
                    f"attention.backend={a.backend}: {heads_local} heads per tensor shard are "
                    f"not divisible by the {u} Ulysses shards; use backend=ulysses_ring with "
                    f"ulysses_shards dividing {heads_local}, ring, or a different mesh.context")
    return cfg
