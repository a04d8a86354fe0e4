"""``ditax generate`` on a full disk (issue 57, item 1; the reported runs): an mp4 ffmpeg could
not finish — ``Error writing trailer: No space left on device`` with exit status 0 — is exit 1,
one line naming the file and the cause, and the video that was there stays (the run said
"wrote F.mp4", exit 0); PNG frames that fail leave no mp4 at its name either (the run with
``--frames-dir`` left the cut mp4). ``--output file:///abs/v.mp4`` is ``/abs/v.mp4``."""

from __future__ import annotations


import numpy as np
import pytest

from ditax.cli import CommandFailed, main
from full_disk import fake_ffmpeg, fill_disk

pytestmark = pytest.mark.usefixtures("fast_compile")
OLD = b"the video that was there before"


def test_an_mp4_ffmpeg_could_not_finish_is_exit_1_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg(tmp_path, "trailer"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "v.mp4").write_bytes(OLD)
    rc = main(["generate", "--model", "demo", "--prompt", "a cat", "--steps", "1", "--frames",
               "5", "--height", "32", "--width", "32", "--output", f"file://{out}/v.mp4",
               "--frames-dir", str(out / "frames"), "--no-progress", "compile_cache=none"])
    said = capsys.readouterr()
    err = said.err.strip().splitlines()
    assert rc == 1 and len(err) == 1, (rc, said.err[-2000:])
    assert err[0] == (f"ditax generate: error: could not write {out / 'v.mp4'}: no space left "
                      f"on device (the disk is full); ffmpeg: Error writing trailer: No space "
                      f"left on device; free space there or write to another disk "
                      f"({out / 'v.mp4'} is as it was before)"), err[0]
    assert "wrote" not in said.out
    assert sorted(p.name for p in out.iterdir()) == ["v.mp4"]
    assert (out / "v.mp4").read_bytes() == OLD


def _output(tmp_path, **kw):
    from ditax.front import Output

    return Output(**{"path": str(tmp_path / "v.mp4"), "fps": 16, **kw})


def test_frames_that_fail_leave_no_mp4_at_its_name(tmp_path, monkeypatch, capsys):
    from ditax.cli.generate_output import write_output

    video = np.random.default_rng(0).random((5, 32, 32, 3)).astype(np.float32)
    args = _output(tmp_path, frames_dir=str(tmp_path / "frames"))
    fill_disk(monkeypatch, after=100, match=".frames.partial")
    with pytest.raises(CommandFailed, match=rf"^could not write {tmp_path / 'frames'}: no "
                                            rf"space left on device"):
        write_output(args, {"video": video, "latents": np.ones(3)}, None, "video")
    assert list(tmp_path.iterdir()) == [] and "wrote" not in capsys.readouterr().out
    monkeypatch.undo()
    write_output(args, {"video": video, "latents": np.ones(3)}, None, "video")
    said = capsys.readouterr().out
    assert f"wrote {tmp_path / 'v.latents.npy'}" in said and "and 5 PNG frames in" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames", "v.latents.npy", "v.mp4"]


def test_an_image_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    from ditax.cli.generate_output import write_output

    image = np.zeros((16, 16, 3), np.float32)
    args = _output(tmp_path, path=str(tmp_path / "x.png"))
    fill_disk(monkeypatch, after=10)
    with pytest.raises(CommandFailed, match=r"x\.png: no space left on device .* \(nothing "
                                            r"was left under that name\)$"):
        write_output(args, image, None, "image")
    assert list(tmp_path.iterdir()) == []
