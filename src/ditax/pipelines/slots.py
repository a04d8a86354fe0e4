"""The arrays of a continuous batch (:mod:`ditax.pipelines.continuous`), one slot a row.

Each slot holds one row's latents, scheduler state, text and condition on the batch axis (the
text in the CFG layout ``[cond_1..cond_n(, uncond_1..uncond_n)]``; a condition leaf holds ``m``
entries a slot: Wan's first-last image pairs 2). A step runs on the slots as they are, so
nothing is copied while the rows stay; a join writes one slot, a resize gathers the kept ones.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ditax.pipelines.sampling import replicate


@jax.jit
def _take_rows(arrays: list, rows: list) -> list:
    """``arrays[i]``'s rows ``rows[i]`` (axis 0), every one in one program: eager takes compile
    a program per array shape (~70 for the slots of a step on a mesh)."""
    return [jnp.take(a, r, axis=0) for a, r in zip(arrays, rows)]


@jax.jit
def _set_rows(dst: list, dst_rows: list, src: list, src_rows: list) -> list:
    """``dst[i]`` with rows ``dst_rows[i]`` set to ``src[i]``'s rows ``src_rows[i]``, in one
    program."""
    return [a.at[i].set(b[j]) for a, i, b, j in zip(dst, dst_rows, src, src_rows)]


@functools.partial(jax.jit, static_argnums=4)
def _join_rows(states: list, xs: list, texts: list, conds: list, use_cfg: bool):
    """The arrays of :meth:`Slots.of` from its rows' own, in one program."""
    cat = lambda *a: jnp.concatenate(a)           # noqa: E731
    return (jax.tree.map(lambda *a: jnp.stack(a), *states), jnp.concatenate(xs),
            jax.tree.map(lambda *leaves: jnp.concatenate(
                [a[0:1] for a in leaves] + ([a[1:2] for a in leaves] if use_cfg else [])),
                *texts),
            None if all(c is None for c in conds) else jax.tree.map(cat, *conds))


class Slots:
    """The batch's arrays: ``n`` slots, each one row's latents, scheduler state, text and
    condition on the batch axis (the text in the CFG layout ``[cond_1..cond_n(,
    uncond_1..uncond_n)]``; a condition leaf holds ``m`` entries a slot: Wan's first-last image
    pairs 2). A step runs on them as they are, so nothing is copied while the rows stay; a
    join writes one slot, a resize gathers the kept slots once. A free slot holds a copy of
    some row and is computed like one (its output is never read)."""

    def __init__(self, n: int, states, x, text, condition, use_cfg: bool, per: tuple):
        self.n, self.states, self.x, self.text, self.condition = n, states, x, text, condition
        self.use_cfg, self.per = use_cfg, per        # per: entries a slot, each condition leaf

    @classmethod
    def of(cls, rows: Sequence, n: int, mesh) -> "Slots":
        """Slots ``0..n-1`` from ``rows``' own arrays (the first row repeated past them)."""
        rows = list(rows) + [rows[0]] * (n - len(rows))
        use_cfg = rows[0].prepared.use_cfg
        states, x, text, condition = _join_rows(
            [r.state for r in rows], [r.x for r in rows], [r.text for r in rows],
            [r.condition for r in rows], use_cfg)
        per = tuple(a.shape[0] for a in jax.tree.leaves(rows[0].condition))
        return cls(n, replicate(states, mesh), replicate(x, mesh), text, condition, use_cfg,
                   per)

    def _text_rows(self, idx, n: int):
        idx = np.asarray(idx)
        return np.concatenate([idx, n + idx]) if self.use_cfg else idx

    def _cond_rows(self, idx, m: int):
        idx = np.asarray(idx)
        return (idx[:, None] * m + np.arange(m)).reshape(-1)

    def gather(self, idx) -> "Slots":
        """New slots holding slots ``idx`` (in that order) of these."""
        idx = np.asarray(idx)
        states, text, cond = (jax.tree.flatten(t) for t in (self.states, self.text,
                                                             self.condition))
        rows = ([idx] * len(states[0]) + [idx]
                + [self._text_rows(idx, self.n)] * len(text[0])
                + [self._cond_rows(idx, m) for m in self.per[:len(cond[0])]])
        out = _take_rows(states[0] + [self.x] + text[0] + cond[0], rows)
        k, t = len(states[0]), len(text[0])
        return Slots(len(idx), jax.tree.unflatten(states[1], out[:k]), out[k],
                     jax.tree.unflatten(text[1], out[k + 1:k + 1 + t]),
                     None if self.condition is None
                     else jax.tree.unflatten(cond[1], out[k + 1 + t:]),
                     self.use_cfg, self.per)

    def put(self, idx, other: "Slots") -> None:
        """Slots ``idx`` of these set to the first ``len(idx)`` slots of ``other``."""
        idx = np.asarray(idx)
        mine = np.arange(len(idx))
        states, text, cond = (jax.tree.flatten(t) for t in (self.states, self.text,
                                                             self.condition))
        k, t, c = len(states[0]), len(text[0]), len(cond[0])
        src = (jax.tree.leaves(other.states) + [other.x] + jax.tree.leaves(other.text)
               + jax.tree.leaves(other.condition))
        out = _set_rows(
            states[0] + [self.x] + text[0] + cond[0],
            [idx] * (k + 1) + [self._text_rows(idx, self.n)] * t
            + [self._cond_rows(idx, m) for m in self.per[:c]],
            src,
            [mine] * (k + 1) + [other._text_rows(mine, other.n)] * t
            + [self._cond_rows(mine, m) for m in self.per[:c]])
        self.states, self.x = jax.tree.unflatten(states[1], out[:k]), out[k]
        self.text = jax.tree.unflatten(text[1], out[k + 1:k + 1 + t])
        if self.condition is not None:
            self.condition = jax.tree.unflatten(cond[1], out[k + 1 + t:])

    def write(self, k: int, row) -> None:
        """Slot ``k`` set to ``row``'s own arrays."""
        self.put([k], Slots.of([row], 1, None))

    def restart(self, k: int) -> None:
        """A freed slot back at step 0 (its sampler state stays finite while it idles)."""
        self.states = self.states._replace(step_index=self.states.step_index.at[k].set(0))


__all__ = ["Slots"]
