"""Kernel-level variants of the flash forward's block loop (issue 54 item 2: within 10% of
JAX's splash kernel on a TPU v5e), each an exact way of computing the same online softmax,
chosen by ``Tune.variant`` (a keyword at the kernel level, not a config key; benchmarks and
tests pick them, the chip decides which, if any, becomes the default).

The flags are the differences found between ditax's forward kernel and splash's
(``docs/tpu_v5e.md``, "Flash kernel vs splash: differences (session 60)"):

- ``unroll``: the loop over a key block's ``block_kv_compute`` slices unrolled (splash:
  ``fori_loop(..., unroll=True)``), so the scheduler can overlap one slice's exp / row sums
  (vector units) with the next slice's ``q kᵀ`` (MXU) instead of draining at every
  iteration's boundary; ditax's plain kernel keeps a rolled loop (compile time).
- ``lanes``: the running max and sum held lane-replicated, ``[block_q, 128]`` float32 (as
  splash's scratch is), instead of ``[block_q, 1]`` columns: the broadcast of ``m`` over a
  ``[block_q, block_kv_compute]`` score tile is then the same vregs repeated, not a lane
  broadcast per step.
- ``prescale``: q multiplied by ``scale·log2 e`` once per query block (into a VMEM copy, in
  float32 then rounded to q's dtype) so scores come out in log2 units and ``P = exp2(s - m)``
  takes one subtraction per score, not a subtraction and a multiply (splash gets the same by
  taking q pre-scaled, and calls ``exp``). The rounding of the scaled q is the only change
  in value (bf16: relative 2^-9 on q's entries, as splash's pre-scaled q).
- ``pv_f32``: ``P`` enters ``P v`` as float32 at the MXU's default precision (v promoted),
  as splash writes it, instead of an explicit cast of ``P`` to v's dtype: Mosaic then picks
  how to feed the MXU (on TPU ``DEFAULT`` is one bf16 pass), which may cost fewer vector ops
  than the round-to-nearest cast on a v5e (no bf16 VPU). In interpret mode on CPU the
  product is float32, slightly *more* exact.

``Variant()`` (all off) is the plain kernel, bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

from ditax.attention.blocks import LANES
from ditax.attention.kernels.mosaic import LN2, LOG2E


def flag_names(text, flags, what: str) -> list[str]:
    """The flags a variant's name turns on: ``+``-joined names of ``flags``, ``"plain"`` (or
    empty / None: none) or ``"all"``; ValueError naming ``what``, the unknown flags and the
    flags there are."""
    if text in ("plain", "", None):
        return []
    names = list(flags) if text == "all" else text.split("+")
    bad = [n for n in names if n not in flags]
    if bad:
        raise ValueError(f"{what} {text!r}: unknown flag(s) {bad}; the flags are "
                         f"{'+'.join(flags)} (or 'plain', 'all')")
    return names


class Variant(NamedTuple):
    """Which of the block-loop variants (module docstring) a flash forward runs (hashable:
    part of the kernels' static ``Tune``)."""

    unroll: bool = False
    lanes: bool = False
    prescale: bool = False
    pv_f32: bool = False

    @classmethod
    def parse(cls, text) -> "Variant":
        """A Variant from its name: flags joined by ``+`` (``"unroll+prescale"``), ``"plain"``
        (none) or ``"all"``; a Variant passes through. ValueError naming the unknown flag."""
        if isinstance(text, Variant):
            return text
        return cls(**{n: True for n in flag_names(text, FLAGS, "flash kernel variant")})

    @property
    def name(self) -> str:
        """The flags that are on, joined by ``+`` (``"plain"`` for none)."""
        return "+".join(f for f, on in zip(FLAGS, self) if on) or "plain"

    def stat_width(self) -> int:
        """Lanes of the running max / sum scratch: 128 (replicated) or 1 (a column)."""
        return LANES if self.lanes else 1

    def units(self, scale: float) -> float:
        """The factor from the kernel's score units to natural-log units of the scaled
        scores: ``scale`` (raw ``q kᵀ``), or ``ln 2`` when q is pre-scaled to log2 units."""
        return LN2 if self.prescale else scale

    def q_factor(self, scale: float) -> float:
        """What ``prescale`` multiplies q by: ``scale·log2 e``."""
        return scale * LOG2E


#: the flags, in the order a name joins them (the fields of :class:`Variant`)
FLAGS = Variant._fields
PLAIN = Variant()

__all__ = ["Variant", "PLAIN", "FLAGS", "flag_names"]
