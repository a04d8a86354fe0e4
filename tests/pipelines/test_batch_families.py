"""Requests of one program shape as one batch through the generic loop
(:func:`ditax.pipelines.batch.sample_batch`), for every family that hands out its loop parts:
Wan text-to-video (the shipped demo), Wan 2.2 two-expert image-to-video, first-last-frame
(CLIP image pairs), TI2V (the image replaces the first latent frame), FLUX.1 with and without
true CFG. A batch of one is the pipeline's call bit for bit; each row of a batch of two (other
prompts, seeds and images) equals its request run alone within float rounding; requests that
cannot share a program are refused naming what differs; the batch key keeps what shapes the
program and drops what is a row's own."""

import json

import numpy as np
import pytest

import ditax
from ditax.pipelines.batch import batch_key, batchable, sample_batch

TOL = 2e-4   # float32 rounding of wider matmuls; any mix-up of rows is far larger


def _check(pipe, calls, tol=TOL):
    """Batch of one == the call (bit for bit); a batch of two == each alone (within ``tol``);
    the two rows differ (their own prompt / seed / image reached them)."""
    assert batchable(pipe)
    alone = [pipe(progress=False, **c) for c in calls]
    one, = sample_batch(pipe, calls[:1])
    assert one.dtype == alone[0].dtype and np.array_equal(one, alone[0])
    both = sample_batch(pipe, calls)
    for got, want in zip(both, alone):
        assert got.shape == want.shape
        err = float(np.abs(got - want).max())
        assert err < tol, err
    assert float(np.abs(alone[0] - alone[1]).max()) > 1e-2
    # padded to 4 rows (a server's bucket): the padding is neither decoded nor returned
    padded = sample_batch(pipe, calls, pad_to=4)
    assert len(padded) == 2 and float(np.abs(padded[1] - alone[1]).max()) < tol


@pytest.fixture(scope="module")
def demo():
    from ditax.demo import model_path

    return ditax.load_pipeline(model_path())


SMALL = dict(height=32, width=32, num_frames=5, num_inference_steps=2)


def test_wan_text_to_video_batches(demo):
    _check(demo, [dict(prompt="a red circle moves right", seed=1, **SMALL),
                  dict(prompt="a blue square moves up", negative_prompt="blurry", seed=2,
                       **SMALL)])
    assert demo.last_stats["steps"] == 2


def test_requests_of_other_shapes_or_cache_settings_are_refused(demo):
    a = dict(prompt="a red circle moves right", seed=1, **SMALL)
    for change, word in ((dict(num_inference_steps=3), "num_inference_steps"),
                         (dict(guidance_scale=2.0), "guidance_scale"),
                         (dict(height=48), "latent_shape"),
                         (dict(cache="first_block"), "cache")):
        with pytest.raises(ValueError, match=word):
            sample_batch(demo, [a, {**a, **change}])


def test_batch_key_keeps_the_program_shape_and_drops_a_rows_own():
    base = dict(prompt="a cat", negative_prompt="", seed=0, height=32, width=32, num_frames=5,
                num_inference_steps=2, guidance_scale=5.0, guidance_scale_2=None, sigmas=None,
                lora_strengths=[0.0, 1.0])
    key = batch_key(base)
    assert json.loads(key)["height"] == 32
    # a row's own: texts, seed, the image contents (only whether an image is given counts)
    assert batch_key({**base, "prompt": "a dog", "negative_prompt": "dark", "seed": 9,
                      "prompt_2": "x"}) == key
    img = batch_key({**base, "image": "AAAA"}, given=("image",))
    assert img != key and batch_key({**base, "image": "BBBB"}, given=("image",)) == img
    assert batch_key({**base, "image": "A", "last_image": "B"},
                     given=("image", "last_image")) != img
    # what shapes the program or its static arguments, for any family's field
    for change in (dict(height=48), dict(num_frames=9), dict(num_inference_steps=3),
                   dict(guidance_scale=4.0), dict(guidance_scale_2=2.0),
                   dict(true_cfg_scale=4.0), dict(max_sequence_length=8),
                   dict(lora_strengths=[1.0, 1.0]), dict(sigmas=[1.0, 0.5])):
        assert batch_key({**base, **change}) != key, change
    # step-cached requests batch with those of the same cache settings
    # (tests/pipelines/test_cache_batch.py)
    cached = batch_key({**base, "cache": "teacache"})
    assert cached is not None and cached != key
    assert batch_key({**base, "cache": "teacache", "prompt": "a dog", "seed": 4}) == cached
    for change in (dict(cache="magcache"), dict(cache_threshold=0.3), dict(cfg_cache=True)):
        assert batch_key({**base, "cache": "teacache", **change}) != cached, change


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    from i2v_reference import tiny_i2v_pipelines

    return tiny_i2v_pipelines(tmp_path_factory)


def test_wan22_two_expert_image_to_video_batches(i2v):
    from i2v_reference import SIZE21, image

    pipe = i2v("i2v22")
    assert pipe.transformer_2 is not None
    kw = dict(SIZE21, num_inference_steps=2, guidance_scale=4.0, guidance_scale_2=2.0)
    _check(pipe, [dict(prompt="a cat", image=image(1, 32, 48), seed=1, **kw),
                  dict(prompt="a dog runs", image=image(2, 32, 48), seed=2, **kw)])


def test_first_last_frame_batches_its_image_pairs(i2v):
    from i2v_reference import SIZE21, image

    pipe = i2v("flf2v")
    kw = dict(SIZE21, num_inference_steps=2, guidance_scale=4.0)
    _check(pipe, [dict(prompt="a cat", image=image(3, 32, 48), last_image=image(4, 32, 48),
                       seed=1, **kw),
                  dict(prompt="a cat", image=image(5, 32, 48), last_image=image(6, 32, 48),
                       seed=1, **kw)])


def test_ti2v_image_batches(i2v):
    from i2v_reference import SIZE22, image

    pipe = i2v("ti2v")
    kw = dict(SIZE22, num_inference_steps=2, guidance_scale=5.0)
    calls = [dict(prompt="a cat", image=image(7, 32, 64), seed=1, **kw),
             dict(prompt="a cat", image=image(8, 32, 64), seed=2, **kw)]
    _check(pipe, calls)
    # with and without an image: two condition structures, not one program
    with pytest.raises(ValueError, match="condition"):
        sample_batch(pipe, [calls[0], dict(calls[1], image=None)])


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from flux_reference import make_tiny_flux_pipeline

    _, folder = make_tiny_flux_pipeline(tmp_path_factory.mktemp("flux_batch"),
                                        guidance_embeds=True)
    return ditax.load_pipeline(folder)


@pytest.mark.parametrize("true_cfg", [False, True])
def test_flux_batches(flux, true_cfg):
    kw = dict(height=32, width=32, num_inference_steps=2, guidance_scale=3.5,
              max_sequence_length=16)
    if true_cfg:   # rows laid out cond_1, cond_2, uncond_1, uncond_2 (text and pooled)
        kw.update(true_cfg_scale=2.0)
        calls = [dict(prompt="a cat", negative_prompt="blurry", seed=1, **kw),
                 dict(prompt="a dog on a beach", negative_prompt="dark", seed=2, **kw)]
    else:
        calls = [dict(prompt="a cat", seed=1, **kw),
                 dict(prompt="a dog on a beach", prompt_2="a dog", seed=2, **kw)]
    _check(flux, calls)
    assert flux.last_stats["transformer_calls"] == 2 * (2 if true_cfg else 1)
