"""Step-level continuous batching (:mod:`ditax.pipelines.continuous`): a request that joins a
running batch at step k, and rows that leave it at their own last step, each give the output
of the same request run alone (within the rounding of a wider matmul); for Wan text-to-video
(UniPC: each row keeps its own sampler history), Wan 2.2's two experts (rows on both sides of
the boundary run as two groups in one step), TI2V (per-token timesteps per row), FLUX.1 with
true CFG, per-row guidance; requests of another shape do not fit; step-cached and
video-to-video requests are refused in one line."""

import numpy as np
import pytest

import ditax
from ditax.pipelines.continuous import ContinuousBatch, pad_rows

TOL = 2e-4   # float32 rounding of wider matmuls; a mixed-up row is off by far more


def _alone(pipe, call):
    return pipe(progress=False, **call)


def _run(batch, schedule):
    """``schedule``: {step number: [(tag, call), ...]} — requests added before that step of
    the batch (0: at the start); returns {tag: output} once every row is done, and the rows
    of each step."""
    out, sizes, k = {}, [], 0
    while True:
        for tag, call in schedule.get(k, []):
            batch.add(tag, call)
        if not batch.rows and all(s <= k for s in schedule):
            return out, sizes
        sizes.append(len(batch))
        for tag, o in batch.step():
            out[tag] = o
        k += 1


def _close(got, want, tol=TOL):
    assert got.shape == want.shape
    err = float(np.abs(np.asarray(got) - np.asarray(want)).max())
    assert err < tol, err


@pytest.fixture(scope="module")
def demo():
    from ditax.demo import model_path

    return ditax.load_pipeline(model_path())


SMALL = dict(height=32, width=32, num_frames=5)


def test_rows_join_at_a_step_and_leave_at_their_last(demo):
    a = dict(prompt="a red circle moves right", seed=1, num_inference_steps=4, **SMALL)
    b = dict(prompt="a blue square moves up", negative_prompt="blurry", seed=2,
             num_inference_steps=4, guidance_scale=3.0, **SMALL)
    c = dict(prompt="a green ball falls", seed=3, num_inference_steps=4, guidance_scale=6.0,
             **SMALL)
    batch = ContinuousBatch(demo, max_rows=4)
    out, sizes = _run(batch, {0: [("a", a)], 2: [("b", b)], 3: [("c", c)]})
    # a alone for 2 steps, with b, then with b and c; a leaves after its 4th step (the 4th
    # of the batch), b after the 6th, c after the 7th
    assert sizes == [1, 1, 2, 3, 2, 2, 1], sizes
    assert batch.resizes == 4          # slots 1 -> 2 -> 4 (b, c join), 4 -> 2 -> 1 (leaving)
    for tag, call in (("a", a), ("b", b), ("c", c)):
        _close(out[tag], _alone(demo, call))
    assert float(np.abs(out["a"] - out["b"]).max()) > 1e-2
    assert batch.key is None and len(batch) == 0


def test_a_request_alone_is_the_call_bit_for_bit(demo):
    call = dict(prompt="a red circle moves right", seed=5, num_inference_steps=3, **SMALL)
    batch = ContinuousBatch(demo, max_rows=4)
    out, sizes = _run(batch, {0: [("a", call)]})
    assert sizes == [1, 1, 1] and np.array_equal(out["a"], _alone(demo, call))


def test_other_shapes_do_not_fit_and_cached_rows_are_refused(demo):
    a = dict(prompt="a cat", seed=1, num_inference_steps=2, **SMALL)
    batch = ContinuousBatch(demo, max_rows=2)
    batch.add("a", a)
    for change in (dict(num_inference_steps=3), dict(height=48), dict(guidance_scale=1.0)):
        row = batch.prepare("x", {**a, **change})
        assert not batch.fits(row), change
        with pytest.raises(ValueError, match="program shape"):
            batch.join(row)
    batch.add("b", dict(a, seed=2, guidance_scale=2.5))     # another scale: one program
    assert not batch.fits(batch.prepare("c", a))             # full
    with pytest.raises(ValueError, match="step-cached"):
        batch.prepare("d", dict(a, cache="first_block"))
    assert batch.drop("a") and not batch.drop("a") and len(batch) == 1


def test_pad_rows():
    assert [pad_rows(n, 16) for n in range(1, 17)] == [1, 2, 4, 4] + [8] * 4 + [12] * 4 \
        + [16] * 4
    assert pad_rows(3, 4, multiple=2) == 4 and pad_rows(1, 4, multiple=2) == 2
    assert pad_rows(5, 4) == 5


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    from i2v_reference import tiny_i2v_pipelines

    return tiny_i2v_pipelines(tmp_path_factory)


def test_two_experts_rows_on_both_sides_of_the_boundary(i2v):
    from i2v_reference import SIZE21, image

    pipe = i2v("i2v22")
    kw = dict(SIZE21, num_inference_steps=4, guidance_scale=4.0, guidance_scale_2=2.0)
    a = dict(prompt="a cat", image=image(1, 32, 48), seed=1, **kw)
    b = dict(prompt="a dog runs", image=image(2, 32, 48), seed=2, **kw)
    batch = ContinuousBatch(pipe, max_rows=2)
    out, _ = _run(batch, {0: [("a", a)], 2: [("b", b)]})
    # a's low-noise steps ran beside b's high-noise ones: two expert groups in one step
    assert batch.steps_run > 6
    for tag, call in (("a", a), ("b", b)):
        _close(out[tag], _alone(pipe, call))


def test_first_last_frame_image_pairs_per_slot(i2v):
    """Two CLIP images a request: each slot holds its pair (a condition leaf of 2 a row)."""
    from i2v_reference import SIZE21, image

    pipe = i2v("flf2v")
    kw = dict(SIZE21, num_inference_steps=3, guidance_scale=4.0)
    calls = [dict(prompt="a cat", image=image(3 + 2 * k, 32, 48),
                  last_image=image(4 + 2 * k, 32, 48), seed=k, **kw) for k in range(3)]
    batch = ContinuousBatch(pipe, max_rows=4)
    out, _ = _run(batch, {0: [("a", calls[0])], 1: [("b", calls[1]), ("c", calls[2])]})
    for tag, call in zip("abc", calls):
        _close(out[tag], _alone(pipe, call))


def test_ti2v_per_token_timesteps_per_row(i2v):
    from i2v_reference import SIZE22, image

    pipe = i2v("ti2v")
    kw = dict(SIZE22, num_inference_steps=3, guidance_scale=5.0)
    a = dict(prompt="a cat", image=image(7, 32, 64), seed=1, **kw)
    b = dict(prompt="a cat", image=image(8, 32, 64), seed=2, **kw)
    out, _ = _run(ContinuousBatch(pipe, max_rows=2), {0: [("a", a)], 1: [("b", b)]})
    for tag, call in (("a", a), ("b", b)):
        _close(out[tag], _alone(pipe, call))


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from flux_reference import make_tiny_flux_pipeline

    _, folder = make_tiny_flux_pipeline(tmp_path_factory.mktemp("flux_continuous"),
                                        guidance_embeds=True)
    return ditax.load_pipeline(folder)


def test_flux_true_cfg_rows_join(flux):
    kw = dict(height=32, width=32, num_inference_steps=3, guidance_scale=3.5,
              max_sequence_length=16, true_cfg_scale=2.0)
    a = dict(prompt="a cat", negative_prompt="blurry", seed=1, **kw)
    b = dict(prompt="a dog on a beach", negative_prompt="dark", seed=2, **kw)
    out, _ = _run(ContinuousBatch(flux, max_rows=2), {0: [("a", a)], 1: [("b", b)]})
    for tag, call in (("a", a), ("b", b)):
        _close(out[tag], _alone(flux, call))


def _lora(path, seed):
    """A random PEFT LoRA for the demo model's self-attention q / v and FFN input (D = 320)."""
    from lora_reference import write_peft

    rng = np.random.default_rng(seed)
    mods = [f"blocks.{i}.attn1.{m}" for i in range(4) for m in ("to_q", "to_v")]
    return write_peft(path, {m: dict(
        down=(0.3 * rng.standard_normal((4, 320))).astype(np.float32),
        up=(0.3 * rng.standard_normal((320, 4))).astype(np.float32), alpha=None, bias=None)
        for m in mods})


def test_rows_with_their_own_loras_equal_generate_with_those_loras(demo, tmp_path):
    """One batch, two rows: LoRA 1 alone, both LoRAs at (0.5, -1): each equals the folder
    loaded with those LoRAs merged at those strengths (``ditax generate --lora``)."""
    from ditax.demo import model_path

    files = [_lora(tmp_path / "one.safetensors", 1), _lora(tmp_path / "two.safetensors", 2)]
    served = ditax.load_pipeline(model_path(), loras=[(f, 0.0) for f in files],
                                 lora_mode="unmerged")
    rows = {"a": [1.0, 0.0], "b": [0.5, -1.0]}
    call = dict(prompt="a red circle moves right", num_inference_steps=3, **SMALL)
    batch = ContinuousBatch(served, max_rows=4)
    out, k = {}, 0
    for tag, s in rows.items():          # b joins at step 1
        batch.add(tag, dict(call, seed=k), strengths=s)
        for t, o in batch.step():
            out[t] = o
        k += 1
    while batch.rows:
        out.update(batch.step())
    for k, (tag, s) in enumerate(rows.items()):
        merged = ditax.load_pipeline(model_path(), loras=[
            (f, v) for f, v in zip(files, s) if v])
        _close(out[tag], _alone(merged, dict(call, seed=k)), tol=5e-4)
    plain = _alone(demo, dict(call, seed=0))
    assert float(np.abs(out["a"] - plain).max()) > 1e-2     # the LoRA reached its row


def test_rows_on_a_mesh():
    """The demo model on 8 devices (the batch split over fsdp, the sequence over context):
    rows joining and leaving equal their requests alone on the same mesh, and run no program
    the warm-up did not compile (XLA hands a step's outputs back split over fsdp)."""
    from ditax.demo import model_path
    from ditax.parallel import make_mesh

    pipe = ditax.load_pipeline(model_path(), mesh=make_mesh({"fsdp": 2, "context": 4}))
    calls = [dict(prompt=p, seed=k, num_inference_steps=3, **SMALL)
             for k, p in enumerate(("a red circle moves right", "a blue square", "a ball"))]
    batch = ContinuousBatch(pipe, max_rows=4)
    batch.warm(calls[0])
    programs = len(pipe.programs._compiled)
    out, _ = _run(batch, {0: [("a", calls[0])], 1: [("b", calls[1]), ("c", calls[2])]})
    assert len(pipe.programs._compiled) == programs      # the warm-up's programs, no other
    for tag, call in zip("abc", calls):
        _close(out[tag], _alone(pipe, call))
