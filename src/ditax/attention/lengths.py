"""Key masks as per-row sequence lengths, for the kernels that only take right padding
(cuDNN through ``jax.nn.dot_product_attention``, TransformerEngine's ``SequenceDescriptor``).

Why lengths: a cuDNN mask or bias must be ``[..., Lq, Lk]`` and its gradient is materialised
in the backward; a padding mask given as lengths costs nothing. Every mask ditax builds is a
*prefix* mask (valid keys first): the model's text mask (tokenizer right padding), the
context-parallel padding of the video tokens (padded at the end), and the per-shard slices
of both. A mask that is not a prefix cannot be expressed as lengths:

- a concrete mask (a numpy or committed jax array, e.g. an eager ``attend`` call) is checked
  here and refused with :class:`~ditax.errors.AttentionUnavailable` naming the row and the fix;
- a traced mask (inside ``jit``: its values are unknown while tracing) is checked on the
  device, ``O(B·Lk)``: rows whose mask is not a prefix come out as NaN — loud (a training
  loss goes non-finite and the run stops), never a silently wrong attention.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ditax.errors import AttentionUnavailable


def _concrete(x):
    """``x`` as a numpy array when its values are known now (not a tracer, all of it on this
    process), else None."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
            RuntimeError):
        return None


def key_lengths(kv_mask, backend: str):
    """``(lengths [B] int32, prefix_ok [B] bool | None)`` of a ``[B, Lk]`` key mask.

    ``lengths`` counts the valid keys of each row. ``prefix_ok`` is None when the mask was
    checked now (concrete); for a traced mask it is the on-device check, to be applied with
    :func:`finish_rows`. Raises :class:`AttentionUnavailable` for a concrete non-prefix mask.
    """
    mask = kv_mask.astype(bool)
    lengths = jnp.sum(mask, axis=1, dtype=jnp.int32)
    Lk = mask.shape[1]
    known = _concrete(kv_mask)
    if known is not None:
        known = known.astype(bool)
        bad = np.flatnonzero((known != (np.arange(Lk) < known.sum(1)[:, None])).any(1))
        if bad.size:
            row = known[bad[0]]
            raise AttentionUnavailable(
                f"attention backend {backend!r} takes key masks as sequence lengths (valid keys "
                f"first, then padding), but kv_mask row {int(bad[0])} is not a prefix (first "
                f"masked key {int(np.argmin(row))}, a valid key after it at "
                f"{int(Lk - 1 - np.argmax(row[::-1]))}); move the valid keys first, or use "
                f"backend='xla' / 'blockwise' for arbitrary masks")
        return lengths, None
    ok = jnp.all(mask == (jnp.arange(Lk)[None, :] < lengths[:, None]), axis=1)
    return lengths, ok


def finish_rows(o, lengths, prefix_ok):
    """o ``[B, Lq, N, K]`` with the rows of batch entries without any valid key set to zero
    (as the reference) and those whose traced mask was not a prefix set to NaN."""
    if lengths is None:
        return o
    keep = lengths > 0
    fill = jnp.zeros((), o.dtype)
    if prefix_ok is not None:
        keep = keep & prefix_ok
        fill = jnp.where(prefix_ok, fill, jnp.asarray(jnp.nan, o.dtype))[:, None, None, None]
    return jnp.where(keep[:, None, None, None], o, fill)


__all__ = ["key_lengths", "finish_rows"]
