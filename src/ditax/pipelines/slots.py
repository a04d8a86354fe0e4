"""The arrays of a continuous batch (:mod:`ditax.pipelines.continuous`), one slot a row.

Each slot holds one row's latents, scheduler state, text and condition on the batch axis (the
text in the CFG layout ``[cond_1..cond_n(, uncond_1..uncond_n)]``; a condition leaf holds ``m``
entries a slot: Wan's first-last image pairs 2). A step runs on the slots as they are, so
nothing is copied while the rows stay; a join writes one slot, a resize gathers the kept ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ditax.pipelines.sampling import replicate


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
        use_cfg = rows[0].prepared.guidance_scale > 1.0
        cat = lambda *a: jnp.concatenate(a)           # noqa: E731
        states = jax.tree.map(lambda *a: jnp.stack(a), *[r.state for r in rows])
        x = jnp.concatenate([r.x for r in rows])
        text = jax.tree.map(lambda *leaves: jnp.concatenate(
            [a[0:1] for a in leaves] + ([a[1:2] for a in leaves] if use_cfg else [])),
            *[r.text for r in rows])
        conds = [r.condition for r in rows]
        condition = None if all(c is None for c in conds) else jax.tree.map(cat, *conds)
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
        take = lambda a, rows: jnp.take(a, jnp.asarray(rows), axis=0)   # noqa: E731
        idx = np.asarray(idx)
        cond = None
        if self.condition is not None:
            leaves, tree = jax.tree.flatten(self.condition)
            cond = jax.tree.unflatten(tree, [take(a, self._cond_rows(idx, m))
                                             for a, m in zip(leaves, self.per)])
        return Slots(len(idx), jax.tree.map(lambda a: take(a, idx), self.states),
                     take(self.x, idx),
                     jax.tree.map(lambda a: take(a, self._text_rows(idx, self.n)), self.text),
                     cond, self.use_cfg, self.per)

    def put(self, idx, other: "Slots") -> None:
        """Slots ``idx`` of these set to the first ``len(idx)`` slots of ``other``."""
        idx = np.asarray(idx)
        k = len(idx)
        mine = np.arange(k)
        self.states = jax.tree.map(lambda a, b: a.at[idx].set(b[:k]), self.states, other.states)
        self.x = self.x.at[idx].set(other.x[:k])
        if self.condition is not None:
            la, tree = jax.tree.flatten(self.condition)
            lb = jax.tree.leaves(other.condition)
            self.condition = jax.tree.unflatten(tree, [
                a.at[self._cond_rows(idx, m)].set(b[self._cond_rows(mine, m)])
                for a, b, m in zip(la, lb, self.per)])
        self.text = jax.tree.map(
            lambda a, b: a.at[self._text_rows(idx, self.n)].set(b[other._text_rows(mine, other.n)]),
            self.text, other.text)

    def write(self, k: int, row) -> None:
        """Slot ``k`` set to ``row``'s own arrays."""
        self.put([k], Slots.of([row], 1, None))

    def restart(self, k: int) -> None:
        """A freed slot back at step 0 (its sampler state stays finite while it idles)."""
        self.states = self.states._replace(step_index=self.states.step_index.at[k].set(0))


__all__ = ["Slots"]
