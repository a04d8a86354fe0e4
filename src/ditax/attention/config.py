"""Attention configuration: which backend runs self- and cross-attention, and its options.

The name lists here are the single source for every other module (the registry, the config
loader, the CLI); :func:`check_attention` holds the rules attention owns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

from ditax.errors import ConfigError, check_choice

LocalBackend = Literal["reference", "xla", "blockwise", "splash", "flash", "cudnn", "te"]
ParallelBackend = Literal["ulysses", "ring", "ulysses_ring"]
CrossBackend = Literal["auto", LocalBackend]
AttentionBackend = Literal["auto", LocalBackend, ParallelBackend]
OutA2A = Literal["flat", "chunked", "shard_major"]
LOCAL_BACKENDS = get_args(LocalBackend)
PARALLEL_BACKENDS = get_args(ParallelBackend)
ATTENTION_BACKENDS = get_args(AttentionBackend)
OUT_A2A_MODES = get_args(OutA2A)


@dataclass(frozen=True)
class AttentionConfig:
    """Attention backends for self- and cross-attention, and sequence-parallel options."""

    backend: AttentionBackend = "xla"    # self-attention backend
    cross_backend: Optional[CrossBackend] = None  # None = the local kernel of `backend`
    local: LocalBackend = "xla"          # local kernel inside ulysses / ring
    out_a2a: OutA2A = "flat"             # Ulysses output exchange
    ulysses_shards: int = 0              # ulysses_ring: Ulysses group size (0 = all of context)
    block_q: Optional[int] = None        # flash / splash / blockwise query block; None = the
    block_kv: Optional[int] = None       # platform's (TPU 512, else 128), clipped to the length


def as_attention_config(attention) -> AttentionConfig:
    """The one coercion of what callers pass as ``attention``: an :class:`AttentionConfig` as
    is, ``None`` as the default, a backend name as ``AttentionConfig(backend=name)``."""
    if attention is None:
        return AttentionConfig()
    if isinstance(attention, AttentionConfig):
        return attention
    if isinstance(attention, str):
        return AttentionConfig(backend=attention)
    raise ConfigError(f"attention={attention!r} is neither a backend name nor an "
                      f"AttentionConfig; pass e.g. attention='xla' or ditax.AttentionConfig(...)")


def check_attention(a: AttentionConfig, *, num_heads: int | None = None,
                    mesh_sizes: dict[str, int] | None = None) -> None:
    """Raise :class:`ConfigError` for attention settings that cannot run.

    ``num_heads`` and ``mesh_sizes`` (the resolved ``data/fsdp/context/tensor`` sizes) add
    the checks that depend on the model and the mesh (Ulysses head divisibility).
    """
    check_choice("attention.backend", a.backend, ATTENTION_BACKENDS)
    if a.cross_backend is not None:
        check_choice("attention.cross_backend", a.cross_backend, get_args(CrossBackend))
    check_choice("attention.local", a.local, LOCAL_BACKENDS)
    check_choice("attention.out_a2a", a.out_a2a, OUT_A2A_MODES)
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
        if getattr(a, k) is not None and getattr(a, k) < 1:
            raise ConfigError(f"attention.{k}={getattr(a, k)} must be >= 1")
    if mesh_sizes is None or num_heads is None or a.backend not in PARALLEL_BACKENDS:
        return
    heads_local = num_heads // mesh_sizes["tensor"]
    context = mesh_sizes["context"]
    if a.backend == "ulysses":
        u = context
    elif a.backend == "ulysses_ring":
        u = a.ulysses_shards or context
        if context % u:
            raise ConfigError(
                f"attention.ulysses_shards={u} does not divide mesh.context="
                f"{context}; pick a divisor of {context}")
    else:
        u = 1
    if heads_local % u:
        raise ConfigError(
            f"attention.backend={a.backend}: {heads_local} heads per tensor shard are "
            f"not divisible by the {u} Ulysses shards; use backend=ulysses_ring with "
            f"ulysses_shards dividing {heads_local}, ring, or a different mesh.context")
