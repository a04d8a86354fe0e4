"""Block-size arithmetic shared by the blocked kernels (flash, splash, blockwise) and the
sequence-parallel planner: rounding lengths up to tile multiples and clipping blocks to short
sequences."""

from __future__ import annotations

from ditax.intmath import round_up  # noqa: F401  (the one helper; attention imports it here)

SUBLANE = 8    # TPU sublane count: second-to-last tile dims are multiples of it
LANES = 128    # TPU lane width: last tile dims (and splash kv blocks) are multiples of it


TPU_BLOCK = 512     # default tile on TPU: fewer grid steps (and smaller splash mask tables)
OTHER_BLOCK = 128   # elsewhere (Pallas interpret mode on CPU): small tiles keep tests quick


def default_block(platform: str) -> int:
    """The block size an unset ``attention.block_q`` / ``block_kv`` means on ``platform``."""
    return TPU_BLOCK if platform == "tpu" else OTHER_BLOCK


def effective_block(block: int, length: int) -> int:
    """The flash block actually used for ``length`` tokens: ``block``, but no larger than the
    length rounded up to the sublane multiple (8), so tiny sequences are not padded to 128."""
    if block <= 0:
        raise ValueError(f"flash block size must be positive, got {block}")
    return min(block, round_up(max(length, 1), SUBLANE))


def check_shard_major(name: str, q, k, v, block_q: int, block_kv: int,
                      whole_blocks: bool) -> None:
    """The shapes a shard-major kernel (flash, sage) takes: q ``[U, B, N, Lc, K]``, k/v
    ``[Uk, B, N, Lk_c, K]``; with ``whole_blocks`` shards of whole blocks (ValueError naming
    the shapes and the fix)."""
    U, B, N, Lc, K = q.shape
    if k.ndim != 5 or k.shape != v.shape or k.shape[1:3] != (B, N) or k.shape[4] != K:
        raise ValueError(f"shard-major {name} expects q [U, B, N, Lc, K] and k/v [Uk, B, N, "
                         f"Lk_c, K]; got q{q.shape} k{k.shape} v{v.shape}")
    if whole_blocks and (Lc % block_q or k.shape[3] % block_kv):
        raise ValueError(f"shard-major {name}: shard length Lc={Lc} (keys {k.shape[3]}) must be "
                         f"a multiple of block_q={block_q} / block_kv={block_kv}; pad the "
                         f"sequence so each shard is a block multiple")


__all__ = ["SUBLANE", "LANES", "TPU_BLOCK", "OTHER_BLOCK", "default_block", "round_up",
           "effective_block", "check_shard_major"]
