"""``ditax generate`` encodes a Wan video's mp4 while the VAE decodes (issue 54, item 5): the
timing line's ``write`` is what is left after the decode and says how much ran beside it; a
decode that cannot hand its frames over says why; the writer's failure, early or late, is the
command's: exit 1, one line, nothing under the output's name (and "wrote" never printed).
The bytes of the file against the whole-video writer: tests/pipelines/wan/test_hand_frames.py."""

from __future__ import annotations

import re

import pytest

from ditax.cli import main
from full_disk import fake_ffmpeg

pytestmark = pytest.mark.usefixtures("fast_compile")
OLD = b"the video that was there before"


def _generate(out, *flags):
    return main(["generate", "--model", "demo", "--prompt", "a cat", "--steps", "1", "--frames",
                 "9", "--height", "16", "--width", "32", "--output", str(out), "--no-progress",
                 "compile_cache=none", *flags])


def test_the_timing_line_says_how_much_of_the_write_was_overlapped(tmp_path, capsys):
    assert _generate(tmp_path / "v.mp4") == 0
    said = capsys.readouterr().out
    line = next(x for x in said.splitlines() if x.startswith("timing:"))
    assert re.search(r"\| decode [\d.]+s \| write [\d.]+s \(overlapped [\d.]+s\)$", line), line
    assert (tmp_path / "v.mp4").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]


def test_a_tiled_decode_writes_after_it_and_says_why(tmp_path, capsys):
    rc = main(["generate", "--model", "demo", "--prompt", "a cat", "--steps", "1", "--frames",
               "5", "--height", "16", "--width", "288", "--output", str(tmp_path / "v.mp4"),
               "--no-progress", "compile_cache=none", "sample.vae_tiling=true"])
    said = capsys.readouterr()
    assert rc == 0, said.err
    line = next(x for x in said.out.splitlines() if x.startswith("timing:"))
    assert line.endswith("(not overlapped: the decode runs in spatial tiles (sample.vae_tiling, "
                         "or a whole decode's fit))"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]


def test_ffmpeg_failing_during_the_decode_is_exit_1_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg(tmp_path, "midway"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "v.mp4").write_bytes(OLD)
    rc = _generate(out / "v.mp4")
    said = capsys.readouterr()
    err = said.err.strip().splitlines()
    assert rc == 1 and len(err) == 1, (rc, said.err[-2000:])
    assert err[0].startswith(f"ditax generate: error: could not write {out / 'v.mp4'}: no space "
                             f"left on device"), err[0]
    assert err[0].endswith(f"({out / 'v.mp4'} is as it was before)"), err[0]
    assert "wrote" not in said.out
    assert sorted(p.name for p in out.iterdir()) == ["v.mp4"]
    assert (out / "v.mp4").read_bytes() == OLD


def test_a_writer_that_raises_is_exit_1_in_one_line(tmp_path, monkeypatch, capsys):
    from ditax.io import ffmpeg

    def broken(args, target, chunks):
        for _ in chunks:
            raise RuntimeError("the encoder broke")

    monkeypatch.setattr(ffmpeg, "write", broken)
    rc = _generate(tmp_path / "v.mp4")
    said = capsys.readouterr()
    err = said.err.strip().splitlines()
    assert rc == 1 and err == ["ditax generate: error: RuntimeError: the encoder broke; rerun "
                               "with --debug for the traceback"], said.err[-2000:]
    assert "wrote" not in said.out and list(tmp_path.iterdir()) == []
