"""Static batches (:func:`ditax.pipelines.batch.sample_batch`, what ``ditax serve --batching
static`` and ``ditax generate --prompts`` run) on a batch-sharded mesh: every step runs the one
compiled step program — XLA hands a batch's latents and sampler state back split over
``fsdp``, and the step pins its outputs to the layout its inputs came in
(:meth:`~ditax.pipelines.programs.Programs.step`'s ``carry``), so the second step's call takes
them — and each row equals its request alone on one device within float rounding, plain and
step-cached."""

import numpy as np
import pytest

import ditax
from ditax.pipelines.batch import sample_batch

TOL = 2e-4   # float32 rounding of wider matmuls and of the mesh; a mixed-up row is far off
SMALL = dict(height=32, width=32, num_frames=5, num_inference_steps=3)


@pytest.fixture(scope="module")
def pipes():
    from ditax.demo import model_path
    from ditax.parallel import make_mesh

    return (ditax.load_pipeline(model_path()),
            ditax.load_pipeline(model_path(), mesh=make_mesh({"fsdp": 2, "context": 4})))


def _calls(**kw):
    return [dict(prompt=p, seed=k, **SMALL, **kw)
            for k, p in enumerate(("a red circle moves right", "a blue square moves up"), 1)]


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        err = float(np.abs(np.asarray(g, np.float32) - np.asarray(w, np.float32)).max())
        assert err < TOL, err


@pytest.mark.parametrize("kw", [{}, dict(cache="teacache", cache_threshold=0.25)],
                         ids=["plain", "step_cached"])
def test_batch_on_a_batch_sharded_mesh_equals_one_device(pipes, kw):
    one, mesh = pipes
    calls = _calls(**kw)
    alone = [one(progress=False, **c) for c in calls]
    assert float(np.abs(alone[0] - alone[1]).max()) > 1e-2      # the rows are told apart
    before = len(mesh.programs._compiled)
    _close(sample_batch(mesh, calls), alone)                    # 2 rows: one per fsdp shard
    two = len(mesh.programs._compiled)
    _close(sample_batch(mesh, calls, pad_to=4), alone)          # 4 rows: two per shard
    # a batch size's steps all run its one step program (the rows' decode is shared)
    assert two > before and len(mesh.programs._compiled) - two == 1
