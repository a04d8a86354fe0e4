"""LoRA and step caching on causal sampling (issue 59 item 3), on the tiny causal folder (the
demo model marked causal, 13 frames = 2 chunks of 2 latent frames, the KV cache carried
between them).

A LoRA on the self-attention's q / k / v (what the KV cache holds) changes the streamed video,
and equals the same folder with the LoRA merged into its weights by hand (numpy, float32:
``W + up @ down``), loaded merged (the default) or unmerged (``lora_mode="unmerged"``, the
server's); ``ditax generate --lora`` writes what the library streams. Step caching runs inside
each chunk (the first step of a chunk always computed): skipping nothing it is the plain
stream bit for bit, skipping it stays close; CFG reuse (``cfg_cache``) is refused in one line
before any weights load (exit 2) and by ``pipe(...)`` before any work; the server takes a
step-cached job."""

from __future__ import annotations

import pathlib

import imageio.v2 as imageio
import numpy as np
import pytest
from causal_folders import SAMPLE, causal_demo_folder
from lora_reference import demo_lora, write_peft

import ditax
from ditax.cli import main
from ditax.errors import RequestError
from ditax.io.video import to_uint8

MODULES = ("attn1.to_q", "attn1.to_k", "attn1.to_v")
CALL = {k: SAMPLE[k] for k in ("height", "width", "num_frames", "num_inference_steps",
                               "guidance_scale", "negative_prompt", "max_sequence_length",
                               "context_chunks")}


def merged_folder(root, lora: dict) -> pathlib.Path:
    """The causal folder with ``lora`` (scale 1) added into its transformer's weights."""
    from safetensors.flax import load_file
    from safetensors.numpy import save_file

    folder = causal_demo_folder(root)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = {k: np.asarray(v, np.float32) for k, v in load_file(str(weights)).items()}
    for module, p in lora.items():
        tensors[f"{module}.weight"] = tensors[f"{module}.weight"] + p["up"] @ p["down"]
    weights.unlink()            # a link to the demo's file: written anew, not through it
    save_file(tensors, str(weights))
    return folder


def stream(pipe) -> np.ndarray:
    return np.concatenate(list(pipe.stream("a red ball", seed=3, **CALL)))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("causal_lora")
    lora = demo_lora(MODULES)
    file = write_peft(root / "lora.safetensors", lora)
    folder = causal_demo_folder(root / "plain")
    return folder, file, merged_folder(root / "merged", lora)


@pytest.fixture(scope="module")
def videos(made):
    """The streamed videos of the plain folder and of the one merged by hand."""
    folder, _, merged = made
    return stream(ditax.load_pipeline(folder)), stream(ditax.load_pipeline(merged))


def test_lora_changes_the_stream_and_equals_merged_weights(made, videos):
    folder, file, _ = made
    plain, by_hand = videos
    with_lora = stream(ditax.load_pipeline(folder, loras=[(str(file), 1.0)]))
    assert with_lora.shape == plain.shape == (13, 64, 64, 3)
    assert np.abs(with_lora - plain).mean() > 1e-2          # the LoRA shows
    # float32 both ways: the same sums in another order (the merge's matmul vs numpy's)
    np.testing.assert_allclose(with_lora, by_hand, atol=2e-5)


def test_unmerged_lora_equals_merged_weights(made, videos):
    """The server's way (``lora_mode="unmerged"``: strengths are data): strength 1 is the
    merged folder's video, strength 0 the plain one's, without a new program."""
    folder, file, _ = made
    plain, by_hand = videos
    unmerged = ditax.load_pipeline(folder, loras=[(str(file), 1.0)], lora_mode="unmerged")
    np.testing.assert_allclose(stream(unmerged), by_hand, atol=2e-5)
    unmerged.transformer.set_lora_strengths([0.0])
    np.testing.assert_allclose(stream(unmerged), plain, atol=2e-5)


def test_generate_with_a_lora_on_a_causal_folder(made, videos, tmp_path, capsys):
    folder, file, _ = made
    frames = tmp_path / "frames"
    rc = main(["generate", "--model", str(folder), "--prompt", "a red ball", "--seed", "3",
               "--lora", f"{file}:1.0", "--no-progress", "--output", str(tmp_path / "o.mp4"),
               "--frames-dir", str(frames)])
    assert rc == 0, capsys.readouterr().err
    got = np.stack([imageio.imread(p) for p in sorted(frames.glob("frame_*.png"))])
    by_hand = to_uint8(videos[1]).astype(int)
    assert np.abs(got - by_hand).max() <= 1                 # float32 rounding, at most 1 level


def sampled(pipe, **cache) -> tuple[np.ndarray, dict]:
    """The latents of 2 chunks (4 latent frames of 8 x 8) in 16 steps each, and the stats."""
    from ditax.models.wan import kv_cache
    from ditax.pipelines.causal import CausalSampler

    sampler = CausalSampler(pipe.transformer.module, kv_cache, pipe.scheduler, 2, 1)
    z = sampler.sample(pipe.encode_text("a red ball", "", False, 16), num_frames=4,
                       latent_hw=(8, 8), num_inference_steps=16, seed=1, **cache)
    return np.asarray(z), sampler.last_stats


@pytest.fixture(scope="module")
def uncached(made):
    pipe = ditax.load_pipeline(made[0])
    return pipe, sampled(pipe)


def test_step_cache_that_skips_nothing_is_the_uncached_stream(uncached):
    """first_block at threshold 0 runs every step through the step cache's split forward
    (block 0, then blocks 1.. against the KV cache, then the head): bit for bit the plain
    chunk program's latents."""
    pipe, (plain, stats) = uncached
    z, st = sampled(pipe, cache="first_block", cache_threshold=0.0)
    np.testing.assert_array_equal(z, plain)
    assert st["skipped_steps"] == {"cond": []} and st["steps"] == 32
    assert st["transformer_calls"] == stats["transformer_calls"] == 2 * (16 + 1)


def test_step_cache_skips_steps_and_stays_close(uncached):
    """first_block at threshold 0.1 skips steps inside each chunk (never a chunk's first: its
    tokens are new) and the latents stay within 15% (mean relative L1) of the uncached ones:
    a skipped step re-applies the blocks' residual of the chunk's last computed step, whose
    block-0 residual differed by less than the threshold (10%), so each skipped step's error
    is of that order and they add up only in part (here 11 of 32 steps skipped: 8%, on this
    untrained tiny model); skipping every step but the first drifts far more (139%)."""
    pipe, (plain, _) = uncached
    z, st = sampled(pipe, cache="first_block", cache_threshold=0.1)
    skipped = st["skipped_steps"]["cond"]
    per_chunk = [[j % 16 for j in skipped if j // 16 == c] for c in range(2)]
    assert all(steps and 0 not in steps for steps in per_chunk), skipped
    assert st["transformer_calls"] == 2 * (16 + 1) - len(skipped)
    rel = np.abs(z - plain).mean() / np.abs(plain).mean()
    assert 0 < rel < 0.15, rel
    far, _ = sampled(pipe, cache="first_block", cache_threshold=100.0)
    assert np.abs(far - plain).mean() / np.abs(plain).mean() > 5 * rel


def test_step_cache_through_the_pipeline_and_generate(made, tmp_path, capsys):
    """``ditax generate sample.cache=first_block`` on a causal folder runs chunk by chunk
    with the step cache and says what it skipped."""
    folder = made[0]
    rc = main(["generate", "--model", str(folder), "--prompt", "a red ball", "--seed", "3",
               "--steps", "16", "sample.cache=first_block", "sample.cache_threshold=100",
               "--no-progress", "--output", str(tmp_path / "o.mp4")])
    out = capsys.readouterr().out
    assert rc == 0 and "step cache first_block (threshold 100.0)" in out, out
    # 2 chunks of 16 steps: all but each chunk's first skipped; + the 2 cache writes
    assert "4 transformer calls for 32 steps (30 skipped" in out, out


def test_cfg_cache_on_a_causal_folder_refused_before_loading(tmp_path, capsys):
    folder = causal_demo_folder(tmp_path)
    rc = main(["generate", "--model", str(folder), "--prompt", "a cat", "--no-progress",
               "sample.cfg_cache=true", "sample.guidance_scale=3"])
    err = [ln for ln in capsys.readouterr().err.splitlines()
           if ln.strip() and not ln.startswith("ditax: ")]
    assert rc == 2 and len(err) == 1, err
    assert "sample.cfg_cache=true" in err[0] and "causal" in err[0], err
    assert "compile cache" not in capsys.readouterr().out       # nothing was loaded


def test_cfg_cache_call_refused_before_any_work(uncached):
    pipe, _ = uncached
    calls = pipe.last_stats
    with pytest.raises(RequestError, match="cfg_cache is not taken by a causal student"):
        pipe("a cat", cfg_cache=True, guidance_scale=3.0)
    assert pipe.last_stats is calls          # no sampling ran


def test_step_cache_on_a_causal_server(tmp_path):
    """``ditax serve`` on a causal folder takes a job with a step cache (its API has no CFG
    reuse field); a cache name that is none is a 400 in one line."""
    from ditax.serve.requests import BadRequest, Limits, check_body

    folder = causal_demo_folder(tmp_path)
    args = (str(folder), [], str(tmp_path / "request.mp4"), Limits(), (), (), "video")
    checked = check_body({"prompt": "a cat", "cache": "first_block"}, *args)
    assert checked.stored["cache"] == "first_block"
    with pytest.raises(BadRequest) as got:
        check_body({"prompt": "a cat", "cache": "first_blok"}, *args)
    assert got.value.status == 400 and "\n" not in str(got.value), str(got.value)
