"""Opt-in variants of the VSA table forward kernel (:mod:`.vsa_table`; issue 58 item 5: the
kernel's per-tile vector work, not its products, bounds it on a TPU v5e), each an exact way
of computing the same fine pass, chosen by a keyword (benchmarks and tests pick them; the
default is the plain kernel, bit for bit; not a config key until a chip says which wins).

A :class:`TableVariant` is the flash forward's softmax flags (:class:`.flash_variant.Variant`:
``lanes``, ``prescale``, ``pv_f32``, the same meaning, the same shared
:func:`~.mosaic.online_softmax_steps`) plus the table kernel's own:

- ``bias``: the key mask enters as a float32 lane row of ``0`` / ``-inf`` added to each
  score tile (one add per score vreg) instead of an int32 row compared and selected (a
  compare and a select per score vreg: at Wan 480p's 3 x 32 x 4 tiles every tile holds
  padding keys, so every tile pays it). ``s + (-inf) = -inf`` and ``s + 0 = s``: the same
  values.
- ``rows``: a step's fold runs over slices of the query tile's rows (unrolled), each
  slice's scores few enough to stay in the 64 vector registers (:meth:`row_block`): the
  plain fold holds ``G`` whole ``t x t`` float32 score tiles at once (``G · t² / 1024``
  vregs: 576 at ``t = 384``, ``G = 4``), which the compiler spills to VMEM and reloads (a
  v5e compile of the plain kernel: 88 % of a fold's stores and 80 % of its loads are
  spills). Each row of the output depends only on its own row's scores: the same values.
  Statically slower on a v5e all the same (K / V reloaded per slice, the slices' chains
  serial: ``docs/sparse_attention.md``); kept for the chip to confirm.
- ``pertile``: the step's tiles folded one at a time (a running max and a rescale per
  tile), not all at once (one max over the group): fewer live scores, more rescales; the
  same softmax up to rounding.

``unroll`` has no meaning here (a step's ``G`` tiles are unrolled already) and is refused.
Names join flags with ``+`` (``"bias+lanes"``), ``"plain"`` is none, ``"all"`` every one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from ditax.attention.kernels.flash_variant import PLAIN as SOFT_PLAIN, Variant, flag_names

#: the table kernel's flags, in the order a name joins them
FLAGS = ("bias", "rows", "pertile", "lanes", "prescale", "pv_f32")
OWN = ("bias", "rows", "pertile")
#: float32 score vregs (8 x 128) a row slice's live scores may take under ``rows`` (of 64)
SCORE_VREGS = 48


class TableVariant(NamedTuple):
    """Which exact rewrites the table forward runs (module docstring); hashable (a static
    argument of the kernel)."""

    soft: Variant = SOFT_PLAIN
    bias: bool = False
    rows: bool = False
    pertile: bool = False

    @classmethod
    def parse(cls, text) -> "TableVariant":
        """A TableVariant from its name (flags joined by ``+``, ``"plain"``, ``"all"``) or
        itself; ValueError naming an unknown flag and the flags there are."""
        if isinstance(text, TableVariant):
            return text
        names = flag_names(text, FLAGS, "VSA table kernel variant")
        soft = [n for n in names if n not in OWN]
        return cls(Variant.parse("+".join(soft)) if soft else SOFT_PLAIN,
                   *(n in names for n in OWN))

    @property
    def name(self) -> str:
        """The flags that are on, joined by ``+`` (``"plain"`` for none)."""
        on = [n for n in OWN if getattr(self, n)] + [n for n in self.soft.name.split("+")
                                                      if n != "plain"]
        return "+".join(on) or "plain"

    def row_block(self, t: int, n: int) -> int:
        """Query rows a fold takes at once: the whole ``t``-token tile, or under ``rows`` the
        largest multiple of 8 dividing ``t`` whose live float32 scores (``n`` tiles', one
        under ``pertile``) stay within :data:`SCORE_VREGS` vregs (at least 8)."""
        if not self.rows:
            return t
        live = 1 if self.pertile else n
        fit = [r for r in range(8, t + 1, 8) if t % r == 0
               and live * r * t <= SCORE_VREGS * 1024]
        return max(fit, default=8)

    def parts(self, n: int) -> list[range]:
        """The step's ``n`` tiles in the order their softmax folds take them: all at once
        (one running max and one rescale per step), or under ``pertile`` one by one."""
        return [range(g, g + 1) for g in range(n)] if self.pertile else [range(n)]

    def mask_operand(self, keep):
        """The key mask as the kernel reads it: the int32 ``keep`` rows, or under ``bias``
        float32 rows of ``0`` (kept) / ``-inf`` (masked); None stays None."""
        if keep is None or not self.bias:
            return keep
        return jnp.where(keep != 0, 0.0, float("-inf")).astype(jnp.float32)

    def query(self, q_ref, scale: float):
        """The query tile a step's products take: as it is, or under ``prescale`` times
        ``scale·log2 e`` (in float32, rounded to q's dtype: scores in log2 units)."""
        q = q_ref[...]
        if not self.soft.prescale:
            return q
        return (q.astype(jnp.float32) * self.soft.q_factor(scale)).astype(q.dtype)


PLAIN = TableVariant()

__all__ = ["FLAGS", "PLAIN", "TableVariant"]
