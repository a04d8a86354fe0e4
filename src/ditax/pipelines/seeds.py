"""The seed rule of every sampling request: an int in ``[0, 2**32)`` (:data:`SEED_LIMIT`).

``jax.random.PRNGKey`` keeps only the low 32 bits of a seed (2**32 draws the same noise as 0,
-1 the same as 2**32 - 1), so a value outside that range would silently repeat another seed's
video; it is refused instead.
"""

from __future__ import annotations

import numpy as np

from ditax.errors import RequestError
from ditax.intmath import SEED_LIMIT


def check_seed(seed, count: int = 1, name: str = "seed") -> None:
    """``seed`` .. ``seed + count - 1`` (one per video) are ints in ``[0, 2**32)``; else a
    :class:`RequestError` naming the value and the range."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise RequestError(f"{name}={seed!r} must be an integer in [0, 2**32) (e.g. 0)")
    last = int(seed) + count - 1
    if seed < 0 or last >= SEED_LIMIT:
        extra = "" if count == 1 else f" (and seed + {count - 1} = {last}, one per prompt)"
        raise RequestError(f"{name}={seed}{extra} is outside [0, 2**32 = {SEED_LIMIT}): jax's "
                           f"PRNGKey keeps only 32 bits, so it would repeat another seed's "
                           f"noise; use 0 <= {name} <= {SEED_LIMIT - count}")


__all__ = ["SEED_LIMIT", "check_seed"]
