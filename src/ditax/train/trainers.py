"""The trainer a config asks for (:func:`make_trainer`): flow matching, DMD2 or Self-Forcing.
Its own module so that no trainer imports another's factory (Self-Forcing's trainer is a
:class:`~ditax.train.distill.DistillTrainer`)."""

from __future__ import annotations

from ditax.config import Config


def make_trainer(cfg: Config, mesh):
    """The trainer a config asks for: :class:`~ditax.train.distill.DistillTrainer` for
    ``distill.method=dmd2``, :class:`~ditax.train.self_forcing.SelfForcingTrainer` for
    ``self_forcing``, else :class:`~ditax.train.step.Trainer`."""
    if cfg.distill.method == "dmd2":
        from ditax.train.distill import DistillTrainer

        return DistillTrainer(cfg, mesh)
    if cfg.distill.method == "self_forcing":
        from ditax.train.self_forcing import SelfForcingTrainer

        return SelfForcingTrainer(cfg, mesh)
    from ditax.train.step import Trainer

    return Trainer(cfg, mesh)


__all__ = ["make_trainer"]
