"""Training with VSA (``attention.sparsity=vsa``, issue 58 item 3) on the ``tiny`` preset
(latents 2 x 8 x 8: a 2 x 4 x 4 token grid, 1 x 2 x 2 tiles: 8 tiles, 2 picked): full
fine-tuning trains the coarse branch's gates (zero at init) with the rest and resumes bit for
bit; LoRA trains adapters with the gates frozen at zero."""

import jax
import numpy as np
import pytest

from ditax.parallel.mesh import make_mesh
from ditax.train.loop import train
from ditax.train.step import Trainer
from latent_datasets import run_cfg, write_dataset

pytestmark = pytest.mark.usefixtures("fast_compile")
VSA = ("attention.sparsity=vsa", "attention.topk=2", "attention.tile=1,2,2")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds") / "latents", n=8)


def _gate(params):
    return params["blocks"]["attn1"]["to_gate_compress"]


def test_full_fine_tune_trains_the_gates_and_resumes_bit_exact(dataset, tmp_path):
    cfg = run_cfg(tmp_path / "unused", dataset, *VSA)
    trainer = Trainer(cfg, make_mesh(cfg.mesh))
    a = train(run_cfg(tmp_path / "a", dataset, *VSA, "steps=4"), trainer=trainer,
              progress=False)
    assert all(np.isfinite(a.losses)) and len(a.losses) == 4
    gate = _gate(a.state["params"])
    assert np.abs(np.asarray(gate["kernel"])).max() > 0 and np.abs(
        np.asarray(gate["bias"])).max() > 0
    b1 = train(run_cfg(tmp_path / "b", dataset, *VSA, "steps=2"), trainer=trainer,
               progress=False)
    b2 = train(run_cfg(tmp_path / "b", dataset, *VSA, "steps=4"), trainer=trainer,
               progress=False)
    assert b2.resumed_from == 2 and a.losses == b1.losses + b2.losses
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b2.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_lora_keeps_the_gates_frozen_at_zero(dataset, tmp_path):
    """LoRA files have no place for the gates (no LoRA name maps them): they stay frozen at
    their init, the coarse branch off; the adapters train on the fine branch."""
    r = train(run_cfg(tmp_path / "l", dataset, *VSA, "steps=2", "lora.rank=2"),
              progress=False)
    assert all(np.isfinite(r.losses)) and len(r.losses) == 2
    assert "to_gate_compress" not in r.state["params"]["blocks"]["attn1"]
    gate = _gate(r.state["frozen"])
    assert not any(np.asarray(x).any() for x in jax.tree.leaves(gate))
