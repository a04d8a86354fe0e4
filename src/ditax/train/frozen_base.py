"""A partly frozen run's base: left out of its checkpoints, referenced there, checked, rebuilt.

A LoRA run (``lora.rank > 0``) trains adapters on a frozen base; a VACE run trains its VACE
branch on a frozen rest (:class:`~ditax.train.adapters.ParamSplit`). The frozen weights never
change, so a checkpoint does not hold them (FLUX.1-dev: 24 GB a checkpoint against a few MB of
adapters): the state keys a trainer lists in ``rebuilt`` (``Trainer``: ``frozen``) are left out
of it, and the checkpoint's JSON item holds a reference to the base instead (``"base"``):

- ``init_from`` (as given) and ``folder`` (the transformer folder it resolved to); none for a
  random base, which is rebuilt from ``seed``;
- ``files``: a fingerprint of the folder, cheap on a 24 GB base: for each of ``config.json``,
  ``*.safetensors`` and ``*.safetensors.index.json`` directly in the folder, its size and a
  sha256 — of the whole file up to :data:`FULL_HASH_BYTES`, else of its safetensors header
  (every tensor's name, dtype, shape and offsets) and :data:`SAMPLES` blocks of
  :data:`SAMPLE_BYTES` evenly spaced over the tensor data (FLUX.1-dev's 3 shards: 12 MB read).
  Modification times are not used: a copied or moved folder keeps its weights, not its mtimes;
- ``checksum``: of the frozen weights as they are on device (:func:`tree_checksum`: one
  position-weighted wrapping integer sum a tensor, independent of the mesh). It covers every
  byte the fingerprint's samples skip, and a random base's draws. On GPU / TPU each sum is one
  fused reduction; XLA:CPU materialises each tensor's uint32 view first (CPU runs are small).

On resume (:func:`check_base`), before the checkpoint is restored, the requested ``init_from``
is compared with the reference: a missing folder, changed files, or a random base asked to
resume on ``init_from`` (or the reverse) is one :class:`~ditax.train.resume.ResumeMismatch`
naming the folder and what changed (exit 2); a folder that moved (same fingerprint, other
path) is said and taken. The base is then rebuilt exactly as at step 0 (``trainer.init``) and
its checksum compared (:func:`check_rebuilt`), so resume stays bit-exact or is refused.

Checkpoints written before this (their state holds ``frozen``, their JSON no ``"base"``) are
restored whole, and such a run's checkpoints keep holding its base (:func:`legacy`).
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import struct
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np

from ditax.errors import DitaxError, ModelNotFound
from ditax.train.resume import ResumeMismatch, ResumePolicy

#: files up to this size are hashed whole
FULL_HASH_BYTES = 64 << 20
#: larger ones: their safetensors header and this many blocks of SAMPLE_BYTES of their data
SAMPLES = 64
SAMPLE_BYTES = 64 << 10


def base_files(folder) -> list[pathlib.Path]:
    """The files of a base folder the fingerprint covers (see the module docstring)."""
    folder = pathlib.Path(folder)
    names = ["config.json"] + [p.name for p in folder.iterdir()
                               if p.name.endswith((".safetensors", ".safetensors.index.json"))]
    return [folder / n for n in sorted(set(names)) if (folder / n).is_file()]


def _file_hash(path: pathlib.Path) -> tuple[str, str]:
    """(sha256, what was read) of one file."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
            return h.hexdigest(), "all"
        start = 0
        if path.suffix == ".safetensors":
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            start = 8 + min(n, size - 8)
            h.update(head + f.read(start - 8))
        span = max(size - start - SAMPLE_BYTES, 0)
        for i in range(SAMPLES):
            f.seek(start + span * i // (SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest(), f"header + {SAMPLES} x {SAMPLE_BYTES} bytes"


def fingerprint(folder) -> dict:
    """``{file name: {"bytes", "sha256", "read"}}`` of a base folder."""
    out = {}
    for p in base_files(folder):
        sha, read = _file_hash(p)
        out[p.name] = {"bytes": p.stat().st_size, "sha256": sha, "read": read}
    return out


def file_changes(old: dict, new: dict) -> list[str]:
    """What differs between two fingerprints, one short phrase a file."""
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if b is None:
            out.append(f"{name}: gone")
        elif a is None:
            out.append(f"{name}: new")
        elif a["bytes"] != b["bytes"]:
            out.append(f"{name}: {a['bytes']} → {b['bytes']} bytes")
        elif a["sha256"] != b["sha256"]:
            out.append(f"{name}: same size, other content")
    return out


def _leaf_sum(x) -> jax.Array:
    """A wrapping uint32 sum of a tensor's bits, each element weighted by an odd number drawn
    from its position: any one changed element changes it (an odd weight is invertible mod
    2**32), and so do moved ones; an integer sum, so it does not depend on the mesh. One
    elementwise expression reduced once: no tensor-sized temporary."""
    if x.dtype == jnp.bool_:
        u = x.astype(jnp.uint32)
    else:
        u = jax.lax.bitcast_convert_type(
            x, {1: jnp.uint8, 2: jnp.uint16}.get(x.dtype.itemsize, jnp.uint32))
        u = u.astype(jnp.uint32)
    idx = jnp.zeros(u.shape, jnp.uint32)
    stride = 1
    for d in reversed(range(u.ndim)):       # the element's flat index, without a reshape
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, u.shape, d) * jnp.uint32(stride)
        stride = stride * u.shape[d] % (1 << 32)
    w = idx * jnp.uint32(2654435762) + jnp.uint32(1)       # odd
    return jnp.sum(u * w, dtype=jnp.uint32)


@functools.lru_cache(maxsize=8)
def _sums_program(mesh):
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax.jit(lambda leaves: jnp.stack([_leaf_sum(x) for x in leaves]),
                   out_shardings=NamedSharding(mesh, P()))


def tree_checksum(tree: dict, mesh) -> str:
    """A checksum of every leaf of ``tree`` (global arrays; one reduction a leaf on their
    devices), as hex: equal trees give equal checksums on any mesh."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    if not flat:
        return ""
    sums = _sums_program(mesh)([x for _, x in flat])
    sums = np.asarray(sums.addressable_data(0))
    h = hashlib.sha256()
    for (path, x), s in zip(flat, sums):
        h.update(f"{jax.tree_util.keystr(path)} {x.shape} {x.dtype} {s};".encode())
    return h.hexdigest()[:32]


# -- the reference in the checkpoint -----------------------------------------------------------


def stored_data(ckpt) -> tuple[int, dict] | None:
    """``(step, data item)`` of the newest checkpoint whose JSON item reads (the reference is
    read before anything is restored), or None."""
    import orbax.checkpoint as ocp

    for step in reversed(ckpt.steps()):
        try:
            data = ckpt.mgr.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))
        except Exception:  # noqa: BLE001 - a damaged step: the restore falls back past it too
            continue
        if isinstance(data["data"], dict):
            return step, data["data"]
    return None


def resume_policy(policy: ResumePolicy, stored) -> ResumePolicy:
    """``policy`` with ``init_from`` left to :func:`check_base` when the run's checkpoints
    reference a base (a moved folder with the same weights resumes exactly: no notice)."""
    if stored is None or "base" not in stored[1]:
        return policy
    return replace(policy, free=policy.free + ("init_from",),
                   notice=tuple(k for k in policy.notice if k != "init_from"))


def check_base(stored, cfg, family, out, say=print) -> dict | None:
    """The fingerprint of ``cfg.init_from``'s folder now, after checking it against the
    reference of the run's newest checkpoint (``stored``, from :func:`stored_data`);
    :class:`ResumeMismatch` for a missing or changed base, or a random base asked to resume
    on weights (or the reverse). None: no reference (a full run, or a new one)."""
    if stored is None or "base" not in stored[1]:
        return None
    step, ref = stored[0], stored[1]["base"]
    where = f"checkpoint step {step} in {out}"
    keep = "its checkpoints hold only the trained weights, not the frozen base"
    if ref.get("init_from") is None:
        if cfg.init_from:
            raise ResumeMismatch(
                f"init_from={cfg.init_from}: {where} was trained on a random base "
                f"(seed={ref.get('seed')}, no init_from) and {keep}; remove init_from to "
                f"resume it, or choose a new output_dir")
        return None
    old = ref["folder"]
    if not cfg.init_from:
        raise ResumeMismatch(
            f"init_from is not set, but {where} was trained on the base in {old} and {keep}; "
            f"set init_from={ref['init_from']} to resume it, or choose a new output_dir")
    try:
        folder = family.weights_folder(cfg.init_from)
    except ModelNotFound as e:
        raise ResumeMismatch(
            f"init_from={cfg.init_from}: the frozen base of {where} is not there "
            f"({str(e).splitlines()[0]}); {keep} (trained on {old}). Put the folder back, or "
            f"set init_from to where it moved, or choose a new output_dir") from None
    except DitaxError as e:             # e.g. its config.json now holds another architecture
        raise ResumeMismatch(
            f"init_from={cfg.init_from}: the frozen base of {where} changed "
            f"({str(e).splitlines()[0]}); {keep} (trained on {old}). Put the old folder back, "
            f"or choose a new output_dir") from None
    now = fingerprint(folder)
    changed = file_changes(ref["files"], now)
    moved = str(folder.absolute()) != old
    if changed:
        what = (f"holds other weights than the base {where} was trained on ({old})" if moved
                else f"changed since {where} was saved")
        raise ResumeMismatch(
            f"init_from={cfg.init_from}: the frozen base in {folder} {what} "
            f"({'; '.join(changed)}); {keep}. Put the old weights back"
            f"{f' or set init_from={old}' if moved else ''}, or choose a new output_dir")
    if moved:
        say(f"the frozen base moved: {old} → {folder.absolute()} (the same files); resuming "
            f"on it")
    return now


def reference(cfg, folder, files, checksum: str) -> dict:
    """The ``"base"`` entry of a checkpoint's JSON item (see the module docstring)."""
    if not cfg.init_from:
        return {"init_from": None, "seed": cfg.seed, "checksum": checksum}
    return {"init_from": str(cfg.init_from), "folder": str(pathlib.Path(folder).absolute()),
            "files": files, "checksum": checksum}


def check_rebuilt(ref: dict, checksum: str, step: int, out) -> None:
    """:class:`ResumeMismatch` when the rebuilt base's checksum is not the stored one."""
    if ref["checksum"] == checksum:
        return
    if ref.get("init_from") is None:
        raise ResumeMismatch(
            f"the random base rebuilt from seed={ref.get('seed')} differs from the one "
            f"checkpoint step {step} in {out} was trained on (checksum {ref['checksum']} → "
            f"{checksum}; another ditax / JAX version draws other weights); resume with the "
            f"versions that wrote the run, or choose a new output_dir")
    raise ResumeMismatch(
        f"init_from={ref['init_from']}: the frozen base rebuilt from {ref['folder']} differs "
        f"from the one checkpoint step {step} in {out} was trained on (checksum "
        f"{ref['checksum']} → {checksum}), though its files' sizes, headers and sampled bytes "
        f"are unchanged; put the old weights back, or choose a new output_dir")


def legacy(stored) -> bool:
    """Whether the run's checkpoints were written before the base was left out of them (they
    reference none and hold it: restored whole, and the run keeps saving it)."""
    return stored is not None and "base" not in stored[1]


def without(tree: dict, keys) -> dict:
    """``tree`` without the top-level ``keys``."""
    return {k: v for k, v in tree.items() if k not in keys}


__all__ = ["FULL_HASH_BYTES", "SAMPLES", "SAMPLE_BYTES", "base_files", "fingerprint",
           "file_changes", "tree_checksum", "stored_data", "resume_policy", "check_base",
           "reference", "check_rebuilt", "legacy", "without"]
