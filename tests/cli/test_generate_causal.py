"""``ditax generate`` on a causal folder (issue 59 item 3): the demo model marked causal
(``causal_chunk`` in its transformer's config.json, ``context_chunks`` in its
``ditax_sample.json``) samples chunk by chunk, past the length it was trained at (17 frames),
and writes the frames ``pipe.stream`` yields; frames that are no whole number of chunks, past
the RoPE table, or a causal option on a bidirectional folder are refused in one line (exit 2)
before any weights load."""

import re

import imageio.v2 as imageio
import numpy as np
import pytest

import ditax
from ditax.cli import main
from ditax.io.video import to_uint8, write_mp4
from ditax.pipelines.batch import batchable
from causal_folders import SAMPLE, causal_demo_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return causal_demo_folder(tmp_path_factory.mktemp("causal"))


def _err_lines(capsys):
    err = capsys.readouterr().err.splitlines()
    return [ln for ln in err if ln.strip() and not ln.startswith("ditax: ")]


def test_generate_streams_a_causal_folder(folder, tmp_path, capsys):
    out, frames = tmp_path / "out.mp4", tmp_path / "frames"
    rc = main(["generate", "--model", str(folder), "--prompt", "a red ball", "--frames", "29",
               "--seed", "3", "--no-progress", "--output", str(out), "--frames-dir",
               str(frames)])
    assert rc == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "29 frames" in said
    assert re.search(r"^write [\d.]+s \(overlapped [\d.]+s\)$", said, re.M), said  # by chunk
    got = np.stack([imageio.imread(p) for p in sorted(frames.glob("frame_*.png"))])
    assert got.shape == (29, 64, 64, 3) and out.is_file()
    pipe = ditax.load_pipeline(folder)
    kw = {k: SAMPLE[k] for k in ("height", "width", "num_inference_steps", "guidance_scale",
                                 "negative_prompt", "max_sequence_length", "context_chunks")}
    parts = list(pipe.stream("a red ball", num_frames=29, seed=3, **kw))
    assert [p.shape[0] for p in parts] == [5, 8, 8, 8]       # chunks of 2 latent frames
    assert pipe.last_stats["chunks"] == 4
    np.testing.assert_array_equal(got, to_uint8(np.concatenate(parts)))
    write_mp4(tmp_path / "whole.mp4", np.concatenate(parts))    # the mp4 encoded as it came
    assert out.read_bytes() == (tmp_path / "whole.mp4").read_bytes()
    assert not batchable(pipe)      # --prompts / a server's batch: one request a call


@pytest.mark.parametrize("args, words", [
    (["--frames", "17"], ["--frames 17", "5 latent frames", "--frames 13 or 21"]),
    (["--frames", "4101"], ["--frames 4101", "rope_max_seq_len=1024"]),
])
def test_bad_causal_requests_refused_in_one_line(folder, capsys, args, words):
    rc = main(["generate", "--model", str(folder), "--prompt", "a cat", "--no-progress", *args])
    err = _err_lines(capsys)
    assert rc == 2 and len(err) == 1, err
    for w in words:
        assert w in err[0], err


def test_causal_option_on_a_bidirectional_folder(tmp_path, capsys):
    rc = main(["generate", "--model", "demo", "--prompt", "a cat", "--no-progress",
               "sample.context_chunks=2"])
    err = _err_lines(capsys)
    assert rc == 2 and len(err) == 1, err
    assert "sample.context_chunks=2" in err[0] and "causal" in err[0], err
    # the same option in a bidirectional folder's ditax_sample.json
    plain = causal_demo_folder(tmp_path, chunk=None, sample={**SAMPLE, "num_frames": 17})
    rc = main(["generate", "--model", str(plain), "--prompt", "a cat", "--no-progress"])
    err = _err_lines(capsys)
    assert rc == 2 and len(err) == 1, err
    assert "context_chunks=1" in err[0] and "bidirectional" in err[0], err


def test_calibrate_cache_refuses_a_causal_folder_before_loading(folder, tmp_path, capsys,
                                                                monkeypatch):
    """calibrate-cache measures a whole video's final latents, which a causal student does not
    make: one line, exit 2, before any weights are read (it used to load, then fail on
    ``output='latent' is not taken``)."""
    import ditax.pipelines.wan.loading as loading

    def no_load(*a, **k):
        raise AssertionError("the pipeline was loaded before the refusal")

    monkeypatch.setattr(loading, "load_pipeline", no_load)
    rc = main(["calibrate-cache", "--model", str(folder), "--prompts", "a cat", "a dog",
               "a bird", "--steps", "4", "--output", str(tmp_path / "n.json"), "--no-progress"])
    err = _err_lines(capsys)
    assert rc == 2 and len(err) == 1, err
    assert "causal student" in err[0] and "calibrate-cache" in err[0], err
    assert not (tmp_path / "n.json").exists()
