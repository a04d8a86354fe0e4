"""The model FLOPs of a DMD2 step (:mod:`ditax.train.distill`), for the run's MFU and ``ditax
plan --train``: how many forwards' worth of transformer work the student and the scores (the
teacher, the critic) run per step, and, for a sparse student, each at its own cost (the
student's sparse attention, the scores' dense twin)."""

from __future__ import annotations

import dataclasses

from ditax.models.base import model_family


class DistillCost:
    """A mixin of :class:`~ditax.train.distill.DistillTrainer` (it gives ``cfg``, ``family``
    and ``score_graph``)."""

    def forwards(self) -> tuple[float, float]:
        """``(student, scores)``: the forwards of one step run on the student's model and on
        the scores' (a backward counts 2 forwards): per critic update the student's rollout
        (on average (K-1)/2 forwards) and estimate, and the critic's forward + backward; per
        student update the rollout, the student's forward + backward, the teacher (2 forwards
        with guidance) and the critic."""
        d = self.cfg.distill
        sim = (d.steps - 1) / 2 if d.backward_simulation else 0.0
        student = d.critic_updates * (sim + 1) + sim + 3
        scores = d.critic_updates * 3 + (2 if d.guidance != 1 else 1) + 1
        return student, scores

    @property
    def flops_factor(self) -> float:
        """Transformer work of one step over one training step's (forward + backward = 3
        forwards): :meth:`forwards` summed (halves and whole numbers: exact), over 3."""
        return sum(self.forwards()) / 3

    def sample_flops(self, latent_shape, text_len: int) -> float | None:
        """Model FLOPs of one step's work on one sample where the student and the scores cost
        differently (a sparse student: its forwards at the family's sparse cost, the scores'
        at the dense model's); None where they cost alike (then the family's
        ``flops_per_sample`` times :attr:`flops_factor`)."""
        if self.score_graph is None:
            return None
        a = dataclasses.replace(self.cfg.attention, sparsity="none", dense_steps=0, topk=0,
                                vsa_fine="gather")
        dense = model_family(self.cfg.model, a, self.cfg.flow)
        student, scores = self.forwards()
        shape = tuple(latent_shape)
        return (self.family.flops_per_sample(shape, text_len) * student
                + dense.flops_per_sample(shape, text_len) * scores) / 3


__all__ = ["DistillCost"]
