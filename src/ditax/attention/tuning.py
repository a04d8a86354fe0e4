"""Attention tiles per TPU generation and shape: the blocks an unset ``attention.block_q`` /
``block_kv`` / ``block_kv_compute`` / ``block_q_bwd`` / ``block_kv_bwd`` means, and the
scoped-VMEM limit those blocks need.

Why a table: on a TPU the attention core is bound by the vector work per score (the exp, the
row max and sum, the casts), not by the MXU, so what decides its speed is how few grid steps
and how little per-step bookkeeping the kernel does — large blocks — within the chip's VMEM
(128 MiB on v5e / v6e, of which the compiler lets a kernel use a scoped part: 16 MiB by
default on v5e, 32 MiB on v6e). Measured on one TPU v5e at Wan 2.1 1.3B's shape (12 heads x
128, 32,760 tokens; ``docs/tpu_v5e.md``): JAX's splash kernel ran at 124 TFLOP/s with 512
blocks, 166 with (1024, 2048, 1024) and 177 with (2048, 4096, 1024) under a 96 MiB scoped
limit. A row is ``(block_q, block_kv, block_kv_compute, block_q_bwd, block_kv_bwd)``.

Splash (JAX's kernel) takes no per-kernel VMEM limit, so its large-block row applies only when
the process raised the compiler's scoped limit (``--xla_tpu_scoped_vmem_limit_kib`` in
``LIBTPU_INIT_ARGS``; ``ditax`` commands set it, :func:`raise_scoped_vmem`); otherwise the
row that fits the default limit. ditax's ``flash`` kernels pass their own limit
(:func:`vmem_limit`), computed from their blocks.

Blocks are fitted to each call's lengths (:func:`fit_block`): the largest block up to the
row's that does not pad the sequence by much (FLUX's 4,608 tokens take 1,536 rather than
2,048, which would pad them to 6,144). A block given in the config is used as given.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from ditax.intmath import round_up
from ditax.tpu_env import (  # noqa: F401  (re-exported: the limits live beside the flag)
    DEFAULT_SCOPED_MIB,
    RAISED_SCOPED_MIB,
    raise_scoped_vmem,
    scoped_vmem_mib,
)

LANES = 128
MIB = 1 << 20


class Row(NamedTuple):
    block_q: int
    block_kv: int
    block_kv_compute: int
    block_q_bwd: int
    block_kv_bwd: int


#: physical VMEM per core: the most a limit may ask
VMEM_MIB = {"v4": 32, "v5e": 128, "v5p": 95, "v6e": 128, "v7x": 64}

_GENERIC = Row(512, 512, 512, 512, 512)
#: sage's compiled tiles (block_q, block_kv) on a TPU where none is given: on one v5e at Wan
#: 1.3B's shape (32,760 tokens) 0.485 s at 128, 0.075 at 512, 0.054 at 1024 and 0.058 at
#: 2048 x 1024 (session 61, ``docs/tpu_v5e.md``); the int8 scales stay per
#: ``attention.quant_block`` tokens inside a tile. Other generations: the v5e row, unmeasured.
SAGE_TILES = (1024, 1024)
#: (kernel, generation, needs a raised scoped limit) -> row
TABLE = {
    ("splash", "v5e", True): Row(2048, 4096, 1024, 1024, 1024),
    ("splash", "v5e", False): Row(1024, 2048, 1024, 512, 1024),
    ("splash", "v6e", True): Row(2048, 4096, 1024, 1024, 1024),
    ("splash", "v6e", False): Row(1024, 2048, 1024, 512, 1024),
    ("flash", "v5e", False): Row(2048, 4096, 1024, 1024, 1024),
    ("flash", "v6e", False): Row(2048, 4096, 1024, 1024, 1024),
}


def generation(device_kind: str) -> Optional[str]:
    """The TPU generation of a jax ``device_kind`` ("TPU v5 lite" -> "v5e", "TPU v6 lite"
    -> "v6e", "TPU v5" / "TPU v5p" -> "v5p", "TPU v4", "TPU7x"), None for anything else."""
    kind = (device_kind or "").lower()
    if "v5 lite" in kind or "v5e" in kind or "v5litepod" in kind:
        return "v5e"
    if "v6 lite" in kind or "v6e" in kind:
        return "v6e"
    if "v5" in kind:
        return "v5p"
    if "v4" in kind:
        return "v4"
    if "7x" in kind or "v7" in kind:
        return "v7x"
    return None


def row(kernel: str, device_kind: str) -> Row:
    """The table's row for ``kernel`` ("splash" | "flash") on a device of ``device_kind``
    (the generic 512 blocks for a chip the table does not name)."""
    gen = generation(device_kind)
    if kernel == "splash":
        raised = scoped_vmem_mib(gen) >= RAISED_SCOPED_MIB.get(gen, 1 << 30)
        return TABLE.get((kernel, gen, raised), TABLE.get((kernel, gen, False), _GENERIC))
    return TABLE.get((kernel, gen, False), _GENERIC)


def fit_block(length: int, largest: int, step: int = LANES, divides: Optional[int] = None
              ) -> int:
    """The block for ``length`` tokens: a multiple of ``step`` no larger than ``largest`` (nor
    than ``length`` rounded up to ``step``), dividing ``divides`` when given, that minimises
    the padded length times a per-block overhead, ``round_up(length, b) * (1 + step / b)``
    (a grid step costs about what ``step`` more tokens do)."""
    top = min(largest, round_up(max(length, 1), step))
    best, cost = step, None
    for b in range(step, top + 1, step):
        if divides is not None and divides % b:
            continue
        c = round_up(length, b) * (1 + step / b)
        if cost is None or c < cost or (c == cost and b > best):
            best, cost = b, c
    return best


def fit_kv_block(length: int, largest: int, compute: int, step: int = LANES) -> int:
    """The key block for ``length`` keys, as :func:`fit_block`, unless that block's compute
    block (its largest divisor up to ``compute``, a multiple of ``step``) is degenerate
    (``<= 2 step``: 23,400 keys fit 1,408 = 11 x 128, whose only such divisor is 128, and
    the kernels' inner loop would then rescale the accumulator every 128 keys): then the block
    minimising ``round_up(length, b) * (1 + step / b + step / c(b))``, the compute loop's
    steps costed as the grid's (23,400 keys: 2,048 with 1,024 compute, 5% more keys)."""
    b = fit_block(length, largest, step)
    if fit_block(b, compute, step, divides=b) > 2 * step or compute <= 2 * step:
        return b
    best, cost = b, None
    for cand in range(step, min(largest, round_up(max(length, 1), step)) + 1, step):
        c = fit_block(cand, compute, step, divides=cand)
        k = round_up(length, cand) * (1 + step / cand + step / c)
        if cost is None or k < cost or (k == cost and cand > best):
            best, cost = cand, k
    return best


def splash_blocks(Lq: int, Lk: int, device_kind: str, given: dict) -> dict:
    """Splash's blocks for one call. A block ``given`` (not None) is used as is, and, as
    before the table, a given forward block stands for its unset backward one (and
    ``block_kv`` for an unset ``block_kv_compute``); the rest come from the table row fitted
    to the lengths, the backward blocks dividing the padded lengths and the compute block
    dividing the key block, as the kernel requires."""
    r = row("splash", device_kind)
    g = {k: v for k, v in given.items() if v is not None}
    bq = g.get("block_q") or fit_block(Lq, r.block_q)
    bkv = g.get("block_kv") or fit_kv_block(Lk, r.block_kv, g.get("block_kv_compute")
                                            or r.block_kv_compute)
    Lq_p, Lk_p = round_up(Lq, bq), round_up(Lk, bkv)

    def pick(name, fwd_name, fwd, top, length):
        if name in g:
            return g[name]
        if fwd_name in g:
            return fwd
        return fit_block(length, top, divides=length)

    return {"block_q": bq, "block_kv": bkv,
            "block_kv_compute": pick("block_kv_compute", "block_kv", bkv, r.block_kv_compute,
                                     bkv),
            "block_q_bwd": pick("block_q_bwd", "block_q", bq, r.block_q_bwd, Lq_p),
            "block_kv_bwd": pick("block_kv_bwd", "block_kv", bkv, r.block_kv_bwd, Lk_p)}


def flash_blocks(Lq: int, Lk: int, device_kind: str, block_q=None, block_kv=None,
                 block_kv_compute=None) -> tuple[int, int, Optional[int]]:
    """``(block_q, block_kv, block_kv_compute)`` of one flash call: given values as is, the
    others from the table fitted to the lengths (off a TPU the table's generic row is not
    used: CPU interpret runs keep 128 blocks, the options' defaults)."""
    r = row("flash", device_kind)
    bq = block_q or fit_block(Lq, r.block_q)
    bkv = block_kv or fit_kv_block(Lk, r.block_kv, block_kv_compute or r.block_kv_compute)
    if block_kv_compute is None and block_kv is None:
        block_kv_compute = fit_block(bkv, r.block_kv_compute, divides=bkv)
    return bq, bkv, block_kv_compute


def vmem_limit(device_kind: str, block_q: int, block_kv: int, head_dim: int,
               block_kv_compute: Optional[int] = None, itemsize: int = 2,
               backward: bool = False) -> Optional[int]:
    """The scoped-VMEM limit (bytes) a flash kernel with these blocks asks for: its working
    set — double-buffered q / k / v / o (and dO) blocks, the float32 accumulators, and a few
    ``[block_q, block_kv_compute]`` float32 score tiles (five for the backward's S, P, dP,
    dS) — with half again for the compiler, at least the generation's default and at most
    three quarters of its VMEM. None off a TPU generation the table knows (the default)."""
    gen = generation(device_kind)
    if gen not in VMEM_MIB:
        return None
    bc = block_kv_compute or block_kv
    io = 2 * itemsize * head_dim * ((3 if backward else 2) * block_q + 2 * block_kv)
    acc = 4 * head_dim * (2 * block_kv if backward else block_q) + 2 * 4 * LANES * block_q
    tiles = (5 if backward else 4) * 4 * block_q * bc
    need = int(1.5 * (io + acc + tiles))
    lo, hi = DEFAULT_SCOPED_MIB.get(gen, 16) * MIB, VMEM_MIB[gen] * MIB * 3 // 4
    return max(lo, min(need, hi))


__all__ = ["Row", "TABLE", "generation", "scoped_vmem_mib", "raise_scoped_vmem", "row",
           "fit_block", "fit_kv_block", "splash_blocks", "flash_blocks", "vmem_limit"]
