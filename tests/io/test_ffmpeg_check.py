"""An mp4 needs ffmpeg: its absence is said in one line before any work (``ditax generate``
exits 2, ``ditax serve`` refuses to start), not found at each video's write after the model
made it — a server on a machine without ffmpeg had lost every job that way."""

import os

import pytest

from ditax.errors import RequestError
from ditax.io.ffmpeg import check_available


def test_the_installed_ffmpeg_is_found():
    path = check_available()
    assert os.path.isfile(path) and os.access(path, os.X_OK)


@pytest.mark.parametrize("exe, words", [
    ("/nonexistent/ffmpeg", "'/nonexistent/ffmpeg' (IMAGEIO_FFMPEG_EXE), which is not an "
                            "executable file"),
    ("no-such-ffmpeg-here", "'no-such-ffmpeg-here' (IMAGEIO_FFMPEG_EXE)")])
def test_a_missing_ffmpeg_is_one_line_naming_the_fix(monkeypatch, exe, words):
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", exe)
    with pytest.raises(RequestError) as e:
        check_available()
    msg = str(e.value)
    assert words in msg and "IMAGEIO_FFMPEG_EXE" in msg.split("which")[1]
    assert len(msg.splitlines()) == 1 and "--" not in msg


def test_a_missing_imageio_ffmpeg_is_named(monkeypatch):
    import sys

    monkeypatch.delenv("IMAGEIO_FFMPEG_EXE", raising=False)
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)     # import fails
    with pytest.raises(RequestError, match="pip install imageio-ffmpeg"):
        check_available()


def test_generate_and_serve_refuse_before_any_work(tmp_path, monkeypatch, capsys):
    from ditax.cli import main

    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", str(tmp_path / "ffmpeg"))     # no such file
    out = tmp_path / "o.mp4"
    rc = main(["generate", "--model", "demo", "--prompt", "a red circle moves right",
               "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not an executable file" in err[0], err
    assert not out.exists()
    rc = main(["serve", "--model", "demo", "--db", str(tmp_path / "jobs.db"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not an executable file" in err[0], err
