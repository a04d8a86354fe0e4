"""Attention configuration: which backend runs self- and cross-attention, and its options.

The name lists here are the single source for every other module (the config loader, the
CLI; the registry is checked against them); :func:`check_attention` holds the rules attention
owns. Besides ``backend`` and ``cross_backend`` every field is an option of some backend, named
as in its options class (:mod:`ditax.attention.options`; checked at import): the config and
``attend(**options)`` speak one vocabulary, and an option none of the configured kernels takes
is refused by the same rule (:func:`ditax.attention.registry.check_options`). The block-sparse
keys (:data:`SPARSITY_KEYS`: ``sparsity``, ``tile``, ``window``, ``decay``, ``dense_steps``,
``topk``, ``vsa_fine``, ``vsa_group``)
are no kernel's option: the model reads them (it lays its video tokens out tile-major and hands the kernel a block table,
:mod:`ditax.attention.sparse.layout`); :func:`check_attention` refuses a backend or mesh that
cannot honour them. ``dense_steps`` is the sampler's: its first steps run the model with
``sparsity=none`` (:mod:`ditax.pipelines.sparse_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional, Union, get_args

from ditax.attention import registry
from ditax.attention.sparse.tiles import DEFAULT as DEFAULT_TILE
from ditax.errors import ConfigError, check_choice

LocalBackend = Literal["reference", "xla", "blockwise", "splash", "flash", "cudnn", "te", "sage",
                       "sage_xla"]
ParallelBackend = Literal["ulysses", "ring", "ulysses_ring"]
CrossBackend = Literal["auto", LocalBackend]
AttentionBackend = Literal["auto", LocalBackend, ParallelBackend]
OutA2A = Literal["flat", "chunked", "shard_major"]
LOCAL_BACKENDS = get_args(LocalBackend)
PARALLEL_BACKENDS = get_args(ParallelBackend)
ATTENTION_BACKENDS = get_args(AttentionBackend)
OUT_A2A_MODES = get_args(OutA2A)
PaddedKeys = Literal["auto", "mask", "split", "duplicate"]   # ditax.attention.splash
PADDED_KEYS_MODES = get_args(PaddedKeys)
Sparsity = Literal["none", "full", "sliding_tile", "radial", "vsa"]
SPARSITY_MODES = get_args(Sparsity)
VsaFine = Literal["gather", "table"]     # ditax.attention.sparse.vsa / .vsa_table
VSA_FINE_MODES = get_args(VsaFine)


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
    block_kv_compute: Optional[int] = None   # splash inner kv step (divides block_kv)
    block_q_bwd: Optional[int] = None    # splash backward query tile; None = block_q
    block_kv_bwd: Optional[int] = None   # splash backward key tile; None = block_kv
    fused_bwd: Optional[bool] = None     # splash: the kernel's fused dq/dkv backward; None = off
    interpret: Optional[bool] = None     # flash / splash Pallas interpret mode; None = on CPU only
    pad_head_dim: Optional[bool] = None  # splash: zero-pad K to 128; None = when compiled
    padded_keys: PaddedKeys = "auto"     # splash, no kv_mask: auto | duplicate | split | mask
    quant_block: int = 128               # sage / sage_xla: tokens per int8 scale of Q and K
    # block-sparse self-attention over the video tokens (issue 58; splash / flash, no context)
    sparsity: Sparsity = "none"          # none | full (every tile) | sliding_tile (STA) | radial
    #                                      | vsa (trainable: coarse pass picks top-k key tiles)
    # latent tokens a tile (frames, rows, cols) | auto: per grid, the 128·k-token tile that pads
    # least (ditax.attention.sparse.tiles.least_padding_tile)
    tile: Union[tuple[int, int, int], Literal["auto"]] = DEFAULT_TILE   # F,Y,X tokens | auto
    window: tuple[int, int, int] = (3, 3, 3)   # sliding_tile: tiles the window spans per axis
    decay: float = 1.0                   # radial: scale of the windows past the dense band
    dense_steps: int = 0                 # sampling: the first k steps dense, the rest sparse
    topk: int = 0                        # vsa: key tiles each query tile attends (>= 1)
    vsa_fine: VsaFine = "gather"         # vsa's fine pass: gathered tiles | table (flash only:
    #                                      Pallas kernels reading the picks, no gather)
    vsa_group: int = 0                   # vsa_fine=table: picked key tiles a grid step (0: chosen
    #                                      per shape, 1: one a step; <= topk)


#: the keys that choose kernels; every other field but the sparsity keys is a backend option
SELECTION_KEYS = ("backend", "cross_backend")
#: the block-sparse keys the model reads (module docstring)
SPARSITY_KEYS = ("sparsity", "tile", "window", "decay", "dense_steps", "topk", "vsa_fine",
                 "vsa_group")
#: ``attention.<option>`` keys, with their config defaults (a value that differs is "given")
OPTION_DEFAULTS = {f.name: f.default for f in fields(AttentionConfig)
                   if f.name not in SELECTION_KEYS + SPARSITY_KEYS}
assert tuple(registry.BACKENDS) == LOCAL_BACKENDS + PARALLEL_BACKENDS, \
    "registry and config names differ"
assert set(OPTION_DEFAULTS) == set(registry.option_vocabulary()), \
    "AttentionConfig's option fields and the options classes' fields differ"


def given_options(a: AttentionConfig) -> dict:
    """The options a config sets: those whose value differs from the config default."""
    return {k: getattr(a, k) for k, d in OPTION_DEFAULTS.items() if getattr(a, k) != d}


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
    check_choice("attention.padded_keys", a.padded_keys, PADDED_KEYS_MODES)
    parallel = a.backend in PARALLEL_BACKENDS
    registry.check_options(a.backend, given_options(a), local=a.local if parallel else None,
                           cross=a.cross_backend)
    if a.out_a2a != "flat" and a.backend not in ("ulysses", "ulysses_ring"):
        raise ConfigError(
            f"attention.out_a2a={a.out_a2a!r} applies to the Ulysses output exchange, but "
            f"attention.backend={a.backend!r} has none; use backend=ulysses or ulysses_ring, "
            f"or out_a2a=flat")
    if a.ulysses_shards < 0:
        raise ConfigError(f"attention.ulysses_shards={a.ulysses_shards} must be >= 0")
    for k in ("block_q", "block_kv", "block_kv_compute", "block_q_bwd", "block_kv_bwd",
              "quant_block"):
        if getattr(a, k) is not None and getattr(a, k) < 1:
            raise ConfigError(f"attention.{k}={getattr(a, k)} must be >= 1")
    if a.backend in ("sage", "sage_xla"):   # the tiles the int8 blocks must divide
        from ditax.attention.sage import check_quant_block

        try:
            check_quant_block(a.block_q, a.block_kv, a.quant_block)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    check_sparsity(a, mesh_sizes)
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


def check_sparsity(a: AttentionConfig, mesh_sizes: dict[str, int] | None = None) -> None:
    """The block-sparse keys' rules: three positive tile sizes (or ``auto``), odd window spans, ``window``
    only with ``sliding_tile`` and ``decay`` (> 0) only with ``radial``, ``dense_steps >= 0``
    only with a sparsity, and a self-attention that can take a block table (``splash`` or
    ``flash``, the sequence whole on every device — ``mesh.context=1`` — or ``ulysses``,
    ``ring`` or ``ulysses_ring`` around one, whole tiles a shard; flash: tiles of a multiple
    of 8 tokens)."""
    check_choice("attention.sparsity", a.sparsity, SPARSITY_MODES)
    for key, v in (("tile", a.tile), ("window", a.window)):
        if key == "tile" and v == "auto":
            continue
        if isinstance(v, str) or len(v) != 3 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in v):
            raise ConfigError(f"attention.{key}={','.join(map(str, v))} must be three ints >= 1 "
                              f"(frames, rows, columns), e.g. attention.{key}="
                              f"{'4,8,8 (or auto)' if key == 'tile' else '3,3,3'}")
    if any(n % 2 == 0 for n in a.window):
        raise ConfigError(f"attention.window={','.join(map(str, a.window))} must be odd spans "
                          f"(a query tile in the middle), e.g. attention.window=3,3,3")
    for key, value, mode, default in (("window", a.window, "sliding_tile", (3, 3, 3)),
                                      ("decay", a.decay, "radial", 1.0)):
        if a.sparsity != mode and value != default:
            shown = ",".join(map(str, value)) if key == "window" else value
            raise ConfigError(f"attention.{key}={shown} applies to attention.sparsity={mode} "
                              f"only (sparsity is {a.sparsity}); drop it or set "
                              f"attention.sparsity={mode}")
    if isinstance(a.decay, bool) or not isinstance(a.decay, (int, float)) or not (
            0 < a.decay < float("inf")):
        raise ConfigError(f"attention.decay={a.decay} must be a number > 0 (the radial windows' "
                          f"scale; smaller is sparser), e.g. attention.decay=0.5")
    if a.sparsity != "vsa" and a.topk:
        raise ConfigError(f"attention.topk={a.topk} applies to attention.sparsity=vsa only "
                          f"(sparsity is {a.sparsity}); drop it or set attention.sparsity=vsa")
    check_choice("attention.vsa_fine", a.vsa_fine, VSA_FINE_MODES)
    if a.sparsity != "vsa" and a.vsa_fine != "gather":
        raise ConfigError(f"attention.vsa_fine={a.vsa_fine} applies to attention.sparsity=vsa "
                          f"only (sparsity is {a.sparsity}); drop it or set "
                          f"attention.sparsity=vsa")
    if a.sparsity != "vsa" and a.vsa_group:
        raise ConfigError(f"attention.vsa_group={a.vsa_group} applies to attention.sparsity=vsa "
                          f"attention.vsa_fine=table only (sparsity is {a.sparsity}); drop it "
                          f"or set attention.sparsity=vsa")
    if isinstance(a.dense_steps, bool) or not isinstance(a.dense_steps, int) or \
            a.dense_steps < 0:
        raise ConfigError(f"attention.dense_steps={a.dense_steps} must be an int >= 0 (the "
                          f"first steps that run dense), e.g. attention.dense_steps=2")
    if a.sparsity == "none":
        if a.dense_steps:
            raise ConfigError(f"attention.dense_steps={a.dense_steps} schedules block-sparse "
                              f"attention, but attention.sparsity=none; set attention.sparsity"
                              f" (e.g. radial) or attention.dense_steps=0")
        return
    sequence = a.backend in registry.SEQUENCE_BACKENDS
    if a.sparsity == "vsa":
        check_vsa(a)
    elif a.backend not in ("splash", "flash") and not (
            sequence and a.local in ("splash", "flash")):
        runs = f"{a.backend} with local={a.local}" if sequence else a.backend
        raise ConfigError(f"attention.sparsity={a.sparsity} needs attention.backend=splash or "
                          f"flash, or ulysses, ring or ulysses_ring with local=splash or flash "
                          f"(the kernels that skip masked blocks; {runs} takes no block "
                          f"table); set attention.backend=splash or attention.sparsity=none")
    if a.tile == "auto":      # 128·k tokens (sparse.tiles.UNIT): every kernel's blocks fit
        tile_len = 0
    else:
        tile_len = a.tile[0] * a.tile[1] * a.tile[2]
    kernel = a.local if sequence else a.backend       # the kernel that reads the table
    if kernel == "flash" and tile_len % 8:
        raise ConfigError(f"attention.tile={','.join(map(str, a.tile))} holds {tile_len} tokens; "
                          f"flash's blocks lie inside one tile and are multiples of 8 tokens, "
                          f"so use a tile of a multiple of 8 tokens, e.g. attention.tile=4,8,8")
    for key in ("block_q", "block_kv", "block_q_bwd", "block_kv_bwd"):
        b = getattr(a, key)
        if kernel == "flash" and b is not None and tile_len and tile_len % b:
            raise ConfigError(f"attention.{key}={b} does not divide the {tile_len}-token tile "
                              f"(attention.tile={','.join(map(str, a.tile))}); flash's blocks "
                              f"lie inside one tile: leave it unset (one tile) or use a divisor")
    context = 1 if mesh_sizes is None else mesh_sizes.get("context", 1)
    if context > 1 and a.sparsity == "vsa" and a.backend != "ulysses":
        raise ConfigError(f"attention.sparsity=vsa with sequence parallelism (mesh.context="
                          f"{context}) runs on attention.backend=ulysses (each device's heads "
                          f"whole; not on a ring: its steps would need the picks among the "
                          f"visiting keys); use backend=ulysses, mesh.context=1 or another "
                          f"sparsity")
    if context > 1 and not sequence:
        raise ConfigError(f"attention.sparsity={a.sparsity} with sequence parallelism "
                          f"(mesh.context={context}) runs on attention.backend=ulysses, ring or "
                          f"ulysses_ring (whole tiles a shard); use one of those backends, "
                          f"mesh.context=1 or attention.sparsity=none")


def check_vsa(a: AttentionConfig) -> None:
    """``sparsity=vsa``'s rules: ``topk >= 1`` (at most the grid's tiles: checked with the
    grid, :func:`ditax.attention.sparse.layout.sparse_layout`) and ``backend`` ``xla``,
    ``auto`` or ``flash`` (its fine stage runs on gathered tiles, :mod:`ditax.attention.
    sparse.vsa`: jnp, or one flash batch row per query tile), or ``ulysses`` with ``local``
    ``xla`` or ``flash`` (all of VSA per device on its heads, :mod:`ditax.attention.sparse.
    vsa_ulysses`); ``vsa_fine=table`` (Pallas kernels reading the picks as a table,
    :mod:`ditax.attention.sparse.vsa_table`) with flash only."""
    if isinstance(a.topk, bool) or not isinstance(a.topk, int) or a.topk < 1:
        raise ConfigError(f"attention.topk={a.topk}: attention.sparsity=vsa needs the key tiles "
                          f"each query tile attends, an int >= 1, e.g. attention.topk=8")
    ulysses = a.backend == "ulysses"
    kernel = a.local if ulysses else a.backend          # the fine stage's kernel
    if a.backend not in ("xla", "auto", "flash") and not (
            ulysses and a.local in ("xla", "flash")):
        runs = f"ulysses with local={a.local}" if ulysses else a.backend
        raise ConfigError(f"attention.sparsity=vsa runs its fine stage on gathered top-k "
                          f"tiles through jnp or the flash kernel; attention.backend="
                          f"{runs} takes no per-query-tile table yet; set "
                          f"attention.backend=xla or flash (or ulysses with local=xla or "
                          f"flash)")
    if a.vsa_fine == "table" and kernel != "flash":
        raise ConfigError(f"attention.vsa_fine=table runs VSA's fine pass on ditax's Pallas "
                          f"table kernels, chosen with attention.backend=flash (is "
                          f"{a.backend}{' with local=' + a.local if ulysses else ''}); set "
                          f"attention.backend=flash (or ulysses with local=flash) or "
                          f"vsa_fine=gather")
    if a.vsa_group and a.vsa_fine != "table":
        raise ConfigError(f"attention.vsa_group={a.vsa_group} groups the picked key tiles of "
                          f"the table kernels' grid steps; attention.vsa_fine={a.vsa_fine} has "
                          f"none: set attention.vsa_fine=table or drop vsa_group")
    if isinstance(a.vsa_group, bool) or not isinstance(a.vsa_group, int) or \
            not 0 <= a.vsa_group <= a.topk:
        raise ConfigError(f"attention.vsa_group={a.vsa_group} must be an int in 0..topk="
                          f"{a.topk} (0: chosen per shape, 1: one key tile a grid step), e.g. "
                          f"attention.vsa_group=4")
