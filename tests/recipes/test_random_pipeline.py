"""``python -m ditax.recipes.random_pipeline``: a random-weight Wan pipeline folder that
``ditax.load_pipeline``, ``ditax generate`` and diffusers' key names accept — built at the tiny
preset here; the full-size presets checked from their plan and the safetensors headers they
would write (no weights drawn)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import ditax
from ditax.errors import ConfigError
from ditax.recipes import random_pipeline as rp


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("random_pipeline") / "tiny"
    assert rp.main(["--preset", "tiny", "--out", str(out), "--threads", "2"]) == 0
    return out


def test_tiny_folder_loads_and_samples(folder):
    sample = json.loads((folder / "ditax_sample.json").read_text())
    assert sample["num_inference_steps"] == 4 and sample["guidance_scale"] == 1.0
    note = json.loads((folder / "ditax_random.json").read_text())
    assert note["preset"] == "tiny" and "text_encoder" in note
    pipe = ditax.load_pipeline(folder)
    video = np.asarray(pipe("a red circle moves right", num_inference_steps=2, seed=0,
                            progress=False))
    assert video.shape == (5, 64, 64, 3)           # the folder's ditax_sample.json size
    assert np.isfinite(video).all() and 0 <= video.min() and video.max() <= 1
    assert video.std() > 0.01                      # not a constant picture
    assert pipe.last_stats["transformer_calls"] == 2   # guidance 1: no unconditional pass


def test_generate_cli_takes_the_folder(folder, tmp_path):
    from ditax.cli import main

    out = tmp_path / "x.mp4"
    assert main(["generate", "--model", str(folder), "--prompt", "a cat", "--steps", "2",
                 "--height", "32", "--width", "48", "--frames", "5", "--output", str(out),
                 "--no-progress"]) == 0
    assert out.stat().st_size > 0


def test_tensors_round_trip_through_shards(tmp_path):
    """Written tensors are the drawn ones (safetensors reads them); a part cut into shards
    gets diffusers' index, which ditax's reader follows."""
    import concurrent.futures

    from safetensors import safe_open

    from ditax.io.weights import Weights

    part = rp.plan("tiny")[0]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        rp.write_part(tmp_path, part, 7, pool, ahead=3, limit=part.nbytes // 3)
    sub = tmp_path / "transformer"
    index = json.loads((sub / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    weights = Weights.open(sub)
    assert sorted(weights.keys()) == sorted(k for k, _ in part.tensors)
    for key, shape in part.tensors[:12]:
        got = np.asarray(weights.get(key), np.float32)
        want = np.asarray(rp.draw(key, shape, part.dtype, 7), np.float32)
        assert got.shape == shape and np.array_equal(got, want), key
    name = index["weight_map"][part.tensors[0][0]]
    with safe_open(str(sub / name), framework="np") as f:
        assert f.metadata() == {"format": "pt"}


def test_init_scales():
    assert rp.init_std("blocks.0.attn1.to_q.bias", (1536,)) is None
    assert rp.init_std("blocks.0.norm2.weight", (1536,)) is None
    assert rp.init_std("decoder.mid_block.resnets.0.norm1.gamma", (384, 1, 1, 1)) is None
    assert rp.init_std("blocks.0.ffn.net.2.weight", (1536, 8960)) == pytest.approx(8960 ** -0.5)
    x = rp.draw("blocks.0.ffn.net.2.weight", (64, 8960), "float32", 0)
    assert x.std() == pytest.approx(8960 ** -0.5, rel=0.02)
    assert np.array_equal(rp.draw("a.bias", (3,), "bfloat16", 0).astype(np.float32), [0, 0, 0])


def _header_params(header: bytes) -> tuple[int, dict]:
    (n,) = struct.unpack("<Q", header[:8])
    head = json.loads(header[8:8 + n])
    head.pop("__metadata__")
    end = 0
    for k, v in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"]):
        assert v["data_offsets"][0] == end, k        # back to back, as safetensors requires
        end = v["data_offsets"][1]
    return sum(int(np.prod(v["shape"])) for v in head.values()), head


def test_full_size_plan_and_headers():
    """wan2.1-t2v-1.3b: the real parameter count in the headers it writes, the real VAE,
    a 4096-wide UMT5 cut to the asked depth; nothing drawn."""
    parts = {p.name: p for p in rp.plan("wan2.1-t2v-1.3b", text_layers=3)}
    tr = parts["transformer"]
    assert tr.params == 1_418_996_800 and tr.nbytes == 2 * tr.params
    total = 0
    for run in rp.shards(tr, rp.SHARD_BYTES):
        n, head = _header_params(rp._header(run, tr.dtype))
        assert {v["dtype"] for v in head.values()} == {"BF16"}
        total += n
    assert total == tr.params
    assert tr.config["num_layers"] == 30 and tr.config["text_dim"] == 4096
    assert parts["vae"].config["base_dim"] == 96 and parts["vae"].dtype == "float32"
    te = parts["text_encoder"].config
    assert (te["d_model"], te["num_layers"], te["num_heads"], te["d_ff"]) == (4096, 3, 64, 10240)
    assert te["vocab_size"] == rp.tokenizer_vocab(rp.tokenizer_folder())
    keys = dict(tr.tensors)
    assert keys["blocks.29.ffn.net.0.proj.weight"] == (8960, 1536)
    assert keys["patch_embedding.weight"] == (1536, 16, 1, 2, 2)


def test_refuses_a_used_folder_and_unknown_presets(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    assert rp.main(["--preset", "tiny", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an empty folder" in err[0], err
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match="wan2.1-t2v-1.3b"):
        rp.plan("wan2.2-ti2v-5b")
