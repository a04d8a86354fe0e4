"""Preprocessing drops nothing silently (issue 41, class 6): before any model loads, one pass
over the folder lists every problem with its file — a caption line for a missing file, a blank
caption, a clip without a caption, an empty file — in one line, exit 2."""

import json

import numpy as np

from ditax.cli import main


def test_every_problem_of_a_folder_is_listed_before_any_encoding(tmp_path, capsys):
    from ditax.io.video import write_mp4

    v = tmp_path / "videos"
    v.mkdir()
    clip = np.random.default_rng(0).uniform(0, 1, (5, 32, 32, 3))
    for name in ("a", "b", "c"):
        write_mp4(v / f"{name}.mp4", clip, fps=8)
    (v / "empty.mp4").write_bytes(b"")
    (v / "a.txt").write_text("a cat")
    (v / "b.txt").write_text("   ")
    (v / "captions.jsonl").write_text(json.dumps({"file": "gone.mp4", "caption": "x"}) + "\n")
    rc = main(["preprocess", str(v), str(tmp_path / "out"), "--model", "demo",
               "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    for words in ("4 problem(s) before any encoding", "empty.mp4", "b.mp4: its caption is blank",
                  "captions.jsonl line 1: 'gone.mp4' is not in the folder",
                  "no caption for ['c.mp4']"):
        assert words in err[0], (words, err[0])
    assert not (tmp_path / "out").exists()
