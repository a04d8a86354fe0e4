"""Integer arithmetic for sizes: padding lengths to block multiples, splitting into chunks."""

from __future__ import annotations

INT_LIMIT = 2**31    # ints jax computes with (its default int32) are in (-INT_LIMIT, INT_LIMIT)
SEED_LIMIT = 2**32   # seeds are in [0, SEED_LIMIT): jax's PRNGKey and grain's shuffle keep 32 bits


def ceil_div(x: int, m: int) -> int:
    """Smallest ``q`` with ``q * m >= x`` (``m > 0``): how many blocks of ``m`` cover ``x``."""
    return -(-x // m)


def round_up(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m`` (``m > 0``), e.g. a length padded to whole blocks."""
    return ceil_div(x, m) * m


__all__ = ["INT_LIMIT", "SEED_LIMIT", "ceil_div", "round_up"]
