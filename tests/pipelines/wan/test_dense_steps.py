"""``attention.dense_steps=k`` (issue 58): a sparse Wan pipeline's first k denoising steps run
dense attention, the rest its block-sparse attention, through two compiled step programs.
With k = the step count the video is the dense pipeline's bit for bit; with k = 0 the latents
are the all-sparse run's; with k in between the latents after each of the first k steps are the
dense run's, the later ones are not, and the final ones are neither run's (the demo's random
pipeline, radial tiles on a 5 x 4 x 4 token grid, interpreted splash)."""

from __future__ import annotations

import numpy as np
import pytest

import ditax
from ditax.attention.sparse.masks import density
from ditax.config import AttentionConfig
from ditax.pipelines.programs import Programs
from random_pipeline import random_pipeline_folder

REQ = dict(prompt="a red fox", height=64, width=64, num_frames=17, num_inference_steps=3,
           guidance_scale=4.0, seed=3, progress=False)
SPARSE = dict(backend="splash", sparsity="radial", tile=(1, 2, 2))


class Recording(Programs):
    """The pipeline's programs, recording the latents after every step and the step programs
    built."""

    def __init__(self):
        super().__init__()
        self.latents, self.built = [], 0

    def step(self, jitted, static, args, carry=None):
        run = super().step(jitted, static, args, carry)

        def recorded(*a):
            out = run(*a)
            self.latents.append(np.asarray(out[0]))
            return out
        return recorded

    def get(self, key, build):
        if key not in self._compiled and key[0][0] is not None and not isinstance(key[0][0], str):
            self.built += 1
        return super().get(key, build)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return random_pipeline_folder(tmp_path_factory.mktemp("dense_steps") / "pipe")


def _run(folder, output="latent", **attention):
    pipe = ditax.load_pipeline(folder, attention=AttentionConfig(**attention))
    pipe.programs = Recording()
    out = pipe(output=output, **REQ)
    return np.asarray(out), pipe.programs


def test_the_table_is_sparse_here():
    from ditax.attention.sparse.layout import sparse_layout

    assert density(sparse_layout(AttentionConfig(**SPARSE), (5, 4, 4)).table.table) < 1


def test_dense_for_every_step_is_the_dense_video_bit_for_bit(folder):
    dense, _ = _run(folder, output="video", backend="splash")
    every, programs = _run(folder, output="video", dense_steps=3, **SPARSE)
    np.testing.assert_array_equal(every, dense)
    assert programs.built == 1          # the sparse program is never needed


def test_zero_and_some_dense_steps(folder):
    dense, d = _run(folder, backend="splash")
    sparse, s = _run(folder, **SPARSE)
    zero, z = _run(folder, dense_steps=0, **SPARSE)
    np.testing.assert_array_equal(zero, sparse)
    assert np.abs(sparse - dense).max() > 1e-4
    some, k = _run(folder, dense_steps=2, **SPARSE)
    assert k.built == 2 and s.built == 1         # dense and sparse, each compiled once
    for i in range(2):
        np.testing.assert_array_equal(k.latents[i], d.latents[i])
    assert np.abs(k.latents[2] - d.latents[2]).max() > 1e-5
    assert np.abs(some - dense).max() > 1e-5 and np.abs(some - sparse).max() > 1e-5


def test_a_step_cache_refuses_dense_steps(folder):
    from ditax.errors import RequestError

    pipe = ditax.load_pipeline(folder, attention=AttentionConfig(dense_steps=1, **SPARSE))
    with pytest.raises(RequestError, match="cache=first_block with attention.dense_steps"):
        pipe(output="latent", cache="first_block", **REQ)


def test_continuous_rows_run_their_own_dense_steps(folder):
    """In a continuous batch each row's first k steps are dense: a row that joins a step late
    runs dense while the first runs sparse (two groups in one step), and each row's latents
    are its own call's (within a wider matmul's rounding)."""
    from ditax.pipelines.continuous import ContinuousBatch

    pipe = ditax.load_pipeline(folder, attention=AttentionConfig(dense_steps=1, **SPARSE))
    call = {k: v for k, v in REQ.items() if k != "progress"}
    calls = {"a": dict(call, output="latent"), "b": dict(call, output="latent", seed=5)}
    batch = ContinuousBatch(pipe, max_rows=2)
    batch.add("a", calls["a"])
    out, runs = {}, []
    for step in range(4):
        if step == 1:
            batch.add("b", calls["b"])
        before = batch.steps_run
        out.update(dict(batch.step()))
        runs.append(batch.steps_run - before)
    assert runs == [1, 2, 1, 1], runs       # step 1: "a" sparse and "b" dense, two groups
    for tag, c in calls.items():
        want = pipe(progress=False, **c)
        assert np.abs(np.asarray(out[tag]) - np.asarray(want)).max() < 2e-4
