"""Integer arithmetic for sizes: padding lengths to block multiples, splitting into chunks."""

from __future__ import annotations


def ceil_div(x: int, m: int) -> int:
    """Smallest ``q`` with ``q * m >= x`` (``m > 0``): how many blocks of ``m`` cover ``x``."""
    return -(-x // m)


def round_up(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m`` (``m > 0``), e.g. a length padded to whole blocks."""
    return ceil_div(x, m) * m


__all__ = ["ceil_div", "round_up"]
