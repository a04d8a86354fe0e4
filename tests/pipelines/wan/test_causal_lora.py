"""LoRA and step caching on causal sampling (issue 59 item 3), on the tiny causal folder (the
demo model marked causal, 13 frames = 2 chunks of 2 latent frames, the KV cache carried
between them).

A LoRA on the self-attention's q / k / v (what the KV cache holds) changes the streamed video,
and equals the same folder with the LoRA merged into its weights by hand (numpy, float32:
``W + up @ down``), loaded merged (the default) or unmerged (``lora_mode="unmerged"``, the
server's); ``ditax generate --lora`` writes what the library streams. Step caching has no
chunk-by-chunk form: ``sample.cache`` / ``sample.cfg_cache`` on a causal folder are refused in
one line before any weights load (exit 2), by the server with a 400, and ``pipe(...,
cache=)`` before any work."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("option", ["sample.cache=first_block", "sample.cache=teacache",
                                    "sample.cfg_cache=true"])
def test_step_cache_on_a_causal_folder_refused_before_loading(tmp_path, capsys, option):
    folder = causal_demo_folder(tmp_path)
    extra = ["sample.guidance_scale=3"] if "cfg_cache" in option else []
    rc = main(["generate", "--model", str(folder), "--prompt", "a cat", "--no-progress",
               option, *extra])
    err = [ln for ln in capsys.readouterr().err.splitlines()
           if ln.strip() and not ln.startswith("ditax: ")]
    assert rc == 2 and len(err) == 1, err
    assert option.split("=")[0] in err[0] and "causal" in err[0] and "drop it" in err[0], err
    assert "compile cache" not in capsys.readouterr().out       # nothing was loaded


def test_step_cache_call_refused_before_any_work(made):
    folder, _, _ = made
    pipe = ditax.load_pipeline(folder)
    calls = pipe.last_stats
    with pytest.raises(RequestError, match="cache is not taken by a causal student"):
        pipe("a cat", cache="first_block")
    assert pipe.last_stats is calls          # no sampling ran
    sample = json.loads((folder / "ditax_sample.json").read_text())
    assert sample["context_chunks"] == 1     # the folder is causal (its sampling settings)


def test_step_cache_on_a_causal_server_is_a_400(tmp_path):
    """``ditax serve`` on a causal folder: a job asking for a step cache is refused at
    ``POST /v1/videos`` (its body checked as ``ditax generate`` checks the flags)."""
    from ditax.serve.requests import BadRequest, Limits, check_body

    folder = causal_demo_folder(tmp_path)
    with pytest.raises(BadRequest) as got:
        check_body({"prompt": "a cat", "cache": "first_block"}, str(folder), [],
                   str(tmp_path / "request.mp4"), Limits(), (), (), "video")
    assert got.value.status == 400 and "causal" in str(got.value), str(got.value)
    assert "\n" not in str(got.value)
