"""The shared run-loop scaffolding (train/session.py): SIGTERM, non-finite loss, cleanup.

The transformer's and the VAE's loops both run inside :class:`RunSession`; their own resume
tests (tests/train/test_train.py, tests/recipes/test_demo_model.py) cover it end to end. Here: its
contract on its own, with a real orbax checkpointer and metrics writer.
"""

import math
import os
import signal

import numpy as np
import pytest

from ditax.config import CheckpointConfig
from ditax.train.checkpoint import Checkpointer
from ditax.train.metrics import MetricsWriter
from ditax.train.session import NonFiniteLoss, RunSession


def _session(tmp_path, total=10, every=4, said=None):
    ckpt = Checkpointer(tmp_path / "ckpt", CheckpointConfig(every=every, keep=10,
                                                            async_save=False))
    writer = MetricsWriter(tmp_path, enabled=True)
    return ckpt, RunSession(ckpt, writer, total=total, start=0, desc="t", every=every,
                            progress=False, say=(said.append if said is not None else print),
                            prefix="unit: ")


def _state(step):
    return {"w": np.full((3,), float(step), np.float32)}


def test_checkpoints_when_due_and_at_the_end(tmp_path):
    ckpt, run = _session(tmp_path, total=10, every=4)
    with run:
        for step in range(1, 11):
            assert run.end_step(step, _state(step), {"step": step}) is False
    assert Checkpointer(tmp_path / "ckpt", CheckpointConfig(every=4)).steps() == [4, 8, 10]
    assert not run.interrupted


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_finishes_the_step_saves_and_stops_then_restores_the_handler(tmp_path, sig):
    said = []
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    ckpt, run = _session(tmp_path, total=10, every=100, said=said)
    stopped_at = None
    with run:
        assert signal.getsignal(sig) is not before[sig]
        for step in range(1, 11):
            if step == 3:
                os.kill(os.getpid(), sig)
            if run.end_step(step, _state(step), {"step": step}):
                stopped_at = step
                break
    assert stopped_at == 3 and run.interrupted and run.signal == sig
    assert {s: signal.getsignal(s) for s in before} == before
    assert Checkpointer(tmp_path / "ckpt", CheckpointConfig(every=100)).steps() == [3]
    name = signal.Signals(sig).name
    assert any(m.startswith(f"unit: stopped by {name}: saved checkpoint step 3")
               and "resumes from step 3" in m for m in said), said


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_loss_raises_naming_the_step_and_the_kept_checkpoint(tmp_path, bad):
    ckpt, run = _session(tmp_path, total=10, every=2)
    with pytest.raises(NonFiniteLoss, match=r"unit: loss is (nan|inf) at step 5; .*last good "
                                            r"checkpoint is step 4 .*Lower the rate"):
        with run:
            for step in range(1, 11):
                run.check_loss(bad if step == 5 else 1.0, step, "Lower the rate")
                run.end_step(step, _state(step), {"step": step})
    # nothing saved after the bad step, and the writer and checkpointer were closed
    assert Checkpointer(tmp_path / "ckpt", CheckpointConfig(every=2)).steps() == [2, 4]
