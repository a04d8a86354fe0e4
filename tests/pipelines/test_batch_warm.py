"""A static server's warm-up (:func:`ditax.serve.batch.warm_dry`) compiles the programs of
every padded batch size without running a step, and they are the programs real batches run:
after it, batches of 1, 2 and 3 requests (padded to 1, 2, 4) compile nothing — no step, no
decode, no eager op — on the shipped demo Wan model and on a Wan 2.2 two-expert image-to-video
model (an image condition, two experts)."""

import jax
import numpy as np
import pytest

import ditax
from ditax.serve.batch import bucket, generate_batch, warm_dry

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_compiles = []


def _count(event: str, duration: float, **kw) -> None:
    if event == BACKEND_COMPILE:
        _compiles.append(event)


jax.monitoring.register_event_duration_secs_listener(_count)


def _warm_then_batches(pipe, calls):
    """Warm ``calls[0]``'s shape at sizes 1, 2, 4 (said lines returned), then run batches of
    1, 2, 3 of ``calls``; returns the lines and the compiles the batches made."""
    said = []
    warm_dry(pipe, calls[0], [1, 2, 4], threads=2, say=said.append)
    before = len(_compiles)
    for n in (1, 2, 3):
        out = generate_batch(pipe, calls[:n], pad_to=bucket(n, 4))
        assert len(out) == n and all(np.isfinite(v).all() for v in out)
    return said, len(_compiles) - before


def test_demo_static_warm_compiles_what_batches_run():
    from ditax.demo import model_path

    pipe = ditax.load_pipeline(model_path())
    pipe.compile_cache = "none"              # compiled here, not read from an earlier run
    calls = [dict(prompt=p, seed=s, height=32, width=32, num_frames=5, num_inference_steps=2)
             for p, s in (("a red circle moves right", 1), ("a blue square moves up", 2),
                          ("a green circle moves down", 3))]
    said, compiles = _warm_then_batches(pipe, calls)
    assert [line.split(" in ")[0] for line in said] == [
        f"warm: batch size {b}" for b in (1, 2, 4)], said
    assert compiles == 0


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    from i2v_reference import tiny_i2v_pipelines

    return tiny_i2v_pipelines(tmp_path_factory)


def test_two_expert_image_to_video_static_warm_compiles_what_batches_run(i2v):
    from i2v_reference import SIZE21, image

    pipe = i2v("i2v22")
    pipe.compile_cache = "none"
    assert pipe.transformer_2 is not None
    kw = dict(SIZE21, num_inference_steps=2, guidance_scale=4.0, guidance_scale_2=2.0)
    calls = [dict(prompt=p, image=image(k, 32, 48), seed=k, **kw)
             for k, p in enumerate(("a cat", "a dog runs", "a bird"), 1)]
    _, compiles = _warm_then_batches(pipe, calls)
    assert compiles == 0
