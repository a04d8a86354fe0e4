"""``stream(pipe, prompt, ...)`` (issue 59 item 3) on a tiny Wan text-to-video folder: one
chunk covering the video gives the pipeline's own frames; several chunks yield their frames
one chunk at a time (1 + 4 (K - 1), then 4 K), equal to decoding the sampler's latents whole."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.errors import DitaxError  # noqa: E402
from ditax.models.wan import kv_cache  # noqa: E402
from ditax.pipelines.causal import CausalSampler  # noqa: E402
from ditax.pipelines.wan.causal import stream  # noqa: E402
from pipeline_reference import make_tiny_pipeline  # noqa: E402

H = W = 32
SIGMAS = (1.0, 0.75, 0.5, 0.25)


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    _, folder = make_tiny_pipeline(tmp_path_factory.mktemp("causal"), scheduler="euler")
    return ditax.load_pipeline(folder)


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_one_chunk_is_the_pipeline_call(pipe, guidance):
    kw = dict(height=H, width=W, num_frames=9, num_inference_steps=4, sigmas=SIGMAS,
              guidance_scale=guidance, seed=3)
    got = list(stream(pipe, "a cat", chunk=3, negative_prompt="blur", **kw))
    assert pipe.last_stats["chunks"] == 1
    want = pipe("a cat", negative_prompt="blur", progress=False, **kw)
    assert len(got) == 1 and got[0].shape == want.shape == (9, H, W, 3)
    np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-5)


def test_chunks_stream_their_frames(pipe):
    kw = dict(num_inference_steps=2, sigmas=SIGMAS[:2], seed=1)
    parts = list(pipe.stream("a dog", chunk=2, context_chunks=1, height=H, width=W,
                        num_frames=13, **kw))
    assert [p.shape[0] for p in parts] == [5, 8]
    assert pipe.last_stats["chunks"] == 2 and pipe.last_stats["transformer_calls"] == 6
    text = pipe.encode_text("a dog", None, False)
    lat = CausalSampler(pipe.transformer.module, kv_cache, pipe.scheduler, 2, 1).sample(
        text, num_frames=4, latent_hw=(4, 4), **kw)
    whole = pipe.decode_video(lat)
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=1e-5)
    assert np.abs(parts[1] - parts[0][-1:]).max() > 1e-3      # a video, not one frame


def test_bad_requests(pipe):
    with pytest.raises(DitaxError, match=r"latent frames=3 .* model.causal_chunk=2"):
        next(stream(pipe, "a cat", chunk=2, height=H, width=W, num_frames=9))
    with pytest.raises(DitaxError, match=r"prompt is empty"):
        next(stream(pipe, " ", chunk=3, height=H, width=W, num_frames=9))
