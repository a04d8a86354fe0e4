"""Row-split convolutional networks: the hooks that let an image / video network run with its
frames' rows (height) split over devices inside ``jax.shard_map`` and give the unsplit result.

A :class:`RowSplit` is made active with :func:`row_split` while a network is traced inside a
``shard_map`` whose inputs are split on the row axis (axis ``-3`` of channels-last ``[..., Y, X,
C]``). Layers ask this module, never the mesh:

- :func:`rows` — before a convolution: ``(x, (top, bottom))`` becomes ``x`` with ``top`` rows of
  the device above and ``bottom`` rows of the device below attached (``jax.lax.ppermute``; the
  first and last devices get zeros, the convolution's own zero padding) and padding ``(0, 0)``,
  so a VALID convolution of it equals the unsplit convolution's rows exactly (``mode=
  "reflect"``: a reflection-padded convolution's, the frame's edge rows mirrored);
- :func:`row_mean` — global statistics (GroupNorm): masked sums ``psum``-ed over the split;
- :func:`gather_rows` / :func:`key_mask` — attention over a whole frame: keys and values of all
  rows (``all_gather``), padding rows masked out.

Heights need not divide by the device count: the caller pads the frame's rows at the bottom to
``devices * local_rows`` and crops after. Padding rows are zeroed before every convolution and
left out of every statistic and attention, so they never reach a real row. Resolutions change
through the network (up / down sampling): a layer's valid row count follows from its local
height, ``rows * local / local_rows`` (``rows`` / ``local_rows`` are the split's reference
resolution, e.g. the latent's).

Without an active split every hook is the identity (``rows`` returns its arguments), so the
one-device programs are unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import jax
import jax.numpy as jnp

ROW_AXIS = -3  # rows of channels-last [..., Y, X, C]


@dataclass(frozen=True)
class RowSplit:
    """Rows split over the ``shard_map`` axes ``axis`` (``devices`` of them, in order).

    ``rows``: real rows at the reference resolution; ``local_rows``: rows per device there
    (``devices * local_rows >= rows``; the rest is padding at the bottom).
    """

    axis: tuple[str, ...]
    devices: int
    rows: int
    local_rows: int

    def valid(self, local: int) -> int:
        """Real rows of the whole frame at the resolution whose per-device height is ``local``."""
        if (self.rows * local) % self.local_rows:
            raise ValueError(f"RowSplit: local height {local} is not a whole multiple of the "
                             f"reference {self.local_rows} rows / {self.rows} real rows; "
                             "the network changes resolution by a factor this split cannot follow.")
        return self.rows * local // self.local_rows

    def row_valid(self, local: int) -> jax.Array | None:
        """Bool ``[local]``: which of this device's rows are real; None when all rows of all
        devices are (no padding)."""
        total = self.valid(local)
        if total == self.devices * local:
            return None
        start = jax.lax.axis_index(self.axis) * local
        return start + jnp.arange(local) < total


_ACTIVE: contextvars.ContextVar[RowSplit | None] = contextvars.ContextVar("ditax_row_split",
                                                                          default=None)


@contextlib.contextmanager
def row_split(split: RowSplit | None):
    """Make ``split`` the active one while tracing the body of a ``shard_map``."""
    token = _ACTIVE.set(split)
    try:
        yield split
    finally:
        _ACTIVE.reset(token)


def active() -> RowSplit | None:
    return _ACTIVE.get()


def _mask_rows(x: jax.Array, keep: jax.Array | None) -> jax.Array:
    if keep is None:
        return x
    return jnp.where(keep[:, None, None], x, jnp.zeros((), x.dtype))


def rows(x: jax.Array, pad: tuple[int, int], mode: str = "zeros"
         ) -> tuple[jax.Array, tuple[int, int]]:
    """``x`` ``[..., y, X, C]`` and the row padding a convolution wants → the input and row
    padding to give it instead: unchanged without a split; with one, padding rows zeroed and
    ``pad[0]`` rows from the device above / ``pad[1]`` from the device below attached, padding
    ``(0, 0)``. ``mode="reflect"``: the frame's own padding is a reflection (``jnp.pad``'s
    ``reflect``, the edge row not repeated), so the rows beyond the frame's top and its last
    real row are mirrored ones (:func:`_reflect`) instead of zeros."""
    split = active()
    top, bottom = int(pad[0]), int(pad[1])
    if split is None or not (top or bottom):
        return x, (top, bottom)
    local = x.shape[ROW_AXIS]
    if max(top, bottom) > local:
        raise ValueError(f"halo.rows: a halo of {max(top, bottom)} rows exceeds the {local} rows "
                         f"each of the {split.devices} devices holds; use fewer devices.")
    x = _mask_rows(x, split.row_valid(local))
    n = split.devices
    parts = []
    if top:  # my top halo is the last rows of the device above (device 0 gets zeros)
        parts.append(jax.lax.ppermute(x[..., local - top:, :, :], split.axis,
                                      [(i, i + 1) for i in range(n - 1)]))
    parts.append(x)
    if bottom:
        parts.append(jax.lax.ppermute(x[..., :bottom, :, :], split.axis,
                                      [(i + 1, i) for i in range(n - 1)]))
    x = jnp.concatenate(parts, axis=ROW_AXIS)
    if mode == "reflect":
        x = _reflect(x, split, local, top)
    return x, (0, 0)


def _reflect(x: jax.Array, split: RowSplit, local: int, top: int) -> jax.Array:
    """A device's haloed rows ``x`` (``top`` halo rows above its ``local`` own) with the rows
    outside the frame — global row ``-k`` and row ``total - 1 + k`` past the last real one —
    replaced by their mirror images (rows ``k`` and ``total - 1 - k``; a one-row frame repeats
    its row). Every mirror a real output row's window reads lies in ``x`` itself: a window
    reaching ``k`` rows past an edge starts at most ``k`` rows inside it."""
    total = split.valid(local)
    g0 = jax.lax.axis_index(split.axis) * local - top       # global row of x's first row
    g = g0 + jnp.arange(x.shape[ROW_AXIS])
    src = jnp.where(g < 0, -g, jnp.where(g >= total, 2 * (total - 1) - g, g))
    src = jnp.clip(src, 0, total - 1)
    return jnp.take(x, jnp.clip(src - g0, 0, x.shape[ROW_AXIS] - 1), axis=x.ndim + ROW_AXIS)


def row_mean(x: jax.Array, axes: tuple[int, ...], row_axis: int) -> jax.Array:
    """Mean of ``x`` over ``axes`` (which hold ``row_axis``, the rows) keeping dims: the plain
    mean without a split; with one, over the real rows of all devices."""
    split = active()
    if split is None:
        return jnp.mean(x, axis=axes, keepdims=True)
    local = x.shape[row_axis]
    keep = split.row_valid(local)
    if keep is not None:
        shape = [1] * x.ndim
        shape[row_axis] = local
        x = jnp.where(keep.reshape(shape), x, jnp.zeros((), x.dtype))
    count = split.valid(local)  # real rows of all devices, times the other reduced axes
    for a in axes:
        if a % x.ndim != row_axis % x.ndim:
            count *= x.shape[a]
    total = jax.lax.psum(jnp.sum(x, axis=axes, keepdims=True), split.axis)
    return total / count


def gather_rows(x: jax.Array) -> jax.Array:
    """``[..., y, X, C]`` → all devices' rows ``[..., devices * y, X, C]`` (the padded frame);
    ``x`` itself without a split."""
    split = active()
    if split is None:
        return x
    return jax.lax.all_gather(x, split.axis, axis=x.ndim + ROW_AXIS, tiled=True)


def key_mask(local: int, width: int) -> jax.Array | None:
    """Bool ``[devices * local * width]``: which pixels of a gathered frame (rows of ``local``
    per device, ``width`` columns, row-major) are real; None without a split or padding."""
    split = active()
    if split is None:
        return None
    total = split.valid(local)
    if total == split.devices * local:
        return None
    return jnp.arange(split.devices * local * width) < total * width


__all__ = ["RowSplit", "active", "gather_rows", "key_mask", "row_mean", "row_split", "rows"]
