"""``ditax preprocess ... --num-processes N --process-id K`` (issue 44 part 3): N processes
write one dataset, each its contiguous share of the sorted clips as
``OUT/part-0000K-of-0000N/``; the process that completes the last part writes ``meta.json``.
The dataset is the same record for record whatever N (here 1, and 2 as two real OS processes
running at once); a part that is missing (a killed process) is redone alone and the meta
appears; parts of another N, other files or other settings are refused in one line."""

import json
import os
import shutil
import subprocess
import sys

import grain
import numpy as np
import pytest

from ditax.cli import main

BUCKETS = "48x32x5,32x48x5"


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Five clips (sorted: a b c d e): landscape, portrait, one too short (skipped)."""
    from ditax.io.video import write_mp4

    v = tmp_path_factory.mktemp("clips")
    r = np.random.default_rng(1)
    for name, (f, h, w) in {"a": (5, 32, 48), "b": (5, 48, 32), "c": (3, 32, 48),
                            "d": (6, 34, 50), "e": (5, 48, 32)}.items():
        write_mp4(v / f"{name}.mp4", r.uniform(0, 1, (f, h, w, 3)), fps=8)
        (v / f"{name}.txt").write_text(f"clip {name}")
    return v


def _args(v, out, *extra):
    # --batch 2: one process encodes a and d together, two processes each with a copy of
    # itself (the padding), and the records are still the same bit for bit
    return ["preprocess", str(v), str(out), "--model", "demo", "--text-len", "8",
            "--no-progress", "--buckets", BUCKETS, "--batch", "2", *extra]


def _records(out):
    """Every record of the dataset at ``out`` in meta order, decoded, with its bucket."""
    from ditax.train.data import _decode, dataset_buckets, read_meta

    recs = []
    for b in dataset_buckets(read_meta(out)):
        src = grain.sources.ArrayRecordDataSource([str(out / f) for f in b["files"]])
        recs += [(b["name"], _decode(src[i])) for i in range(len(src))]
    return recs


def _same_meta(a, b):
    """meta.json of ``a`` and ``b`` equal apart from the files' paths and num_processes."""
    ma, mb = (json.loads((p / "meta.json").read_text()) for p in (a, b))
    for m in (ma, mb):
        m.pop("files"), m.pop("num_processes")
        for bucket in m["buckets"]:
            bucket.pop("files")
    assert ma == mb


@pytest.fixture(scope="module")
def datasets(clips, tmp_path_factory):
    """The dataset written by one process, and by two OS processes at once: process 1 of 2 a
    subprocess (``python -m ditax.cli``), process 0 of 2 this one, meanwhile. Returns the two
    folders and what each of the two processes said."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("out")
    one, two = root / "one", root / "two"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "ditax.cli",
                             *_args(clips, two, "--num-processes", "2", "--process-id", "1")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert main(_args(clips, two, "--num-processes", "2", "--process-id", "0")) == 0
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(_args(clips, one)) == 0
    theirs = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, theirs
    return one, two, [said.getvalue(), theirs]


def test_two_processes_write_the_dataset_of_one(datasets):
    one, two, said = datasets
    from ditax.train.data import read_meta

    meta = read_meta(two)
    assert meta["num_processes"] == 2 and read_meta(one)["num_processes"] == 1
    # process 0 took a b (sorted 5 clips: [0, 2)), process 1 c d e; c is skipped by 1
    assert "part 0 of 2: [1/2] a.mp4 -> 48x32x5" in said[0] and "c.mp4" not in said[0]
    assert "skip c.mp4: 3 frames" in said[1] and "part 1 of 2: [2/2]" in said[1]
    assert [b["files"] for b in meta["buckets"]] == [
        ["part-00000-of-00002/48x32x5/data-00000.array_record",
         "part-00001-of-00002/48x32x5/data-00000.array_record"],
        ["part-00000-of-00002/32x48x5/data-00000.array_record",
         "part-00001-of-00002/32x48x5/data-00000.array_record"]]
    assert sum("meta.json written over 2 parts: 4 samples in 2 bucket(s): 48x32x5 2, "
               "32x48x5 2; 1 clip(s) skipped" in s for s in said) == 1, said
    _same_meta(one, two)
    a, b = _records(one), _records(two)
    assert len(a) == len(b) == 4
    for (na, ra), (nb, rb) in zip(a, b):
        assert na == nb and ra.keys() == rb.keys()
        for k in ra:
            np.testing.assert_array_equal(ra[k], rb[k], err_msg=f"{na} {k}")
    assert (one / "null_text.safetensors").read_bytes() == (
        two / "null_text.safetensors").read_bytes()


def test_a_killed_part_is_redone_alone(datasets, clips, tmp_path, capsys):
    one, two, _ = datasets
    out = tmp_path / "two"
    shutil.copytree(two, out)
    # process 1 was killed: no part 1, its hidden half-written folder, no meta.json
    shutil.rmtree(out / "part-00001-of-00002")
    (out / "meta.json").unlink()
    (out / ".part-00001-of-00002.partial-4242").mkdir()
    (out / ".part-00001-of-00002.partial-4242" / "junk").write_text("x")
    kept = {p: p.stat().st_mtime_ns for p in (out / "part-00000-of-00002").rglob("*")}
    # process 0 again: its part is complete; nothing to encode, no meta yet
    assert main(_args(clips, out, "--num-processes", "2", "--process-id", "0")) == 0
    said = capsys.readouterr().out
    assert "part-00000-of-00002 is complete already; nothing to encode" in said, said
    assert "1 of 2 parts complete; waiting for part-00001-of-00002" in said
    assert not (out / "meta.json").exists()
    # process 1 again: only its part is encoded, then the meta appears
    assert main(_args(clips, out, "--num-processes", "2", "--process-id", "1")) == 0
    said = capsys.readouterr().out
    assert "a.mp4" not in said and "part 1 of 2: [1/2] d.mp4" in said, said
    assert not list(out.glob(".part-*"))
    assert {p: p.stat().st_mtime_ns for p in (out / "part-00000-of-00002").rglob("*")} == kept
    _same_meta(one, out)
    assert [n for n, _ in _records(out)] == [n for n, _ in _records(one)]
    # once complete, any process says so and exits 0
    assert main(_args(clips, out, "--num-processes", "2", "--process-id", "0")) == 0
    assert "is complete (meta.json over 2 parts); nothing to do" in capsys.readouterr().out


def test_other_parts_files_or_settings_are_refused(datasets, clips, tmp_path, capsys,
                                                   monkeypatch):
    import ditax.train.preprocess as pre

    monkeypatch.setattr(pre, "_encoders", lambda *a: pytest.fail("a model loaded"))
    _, two, _ = datasets
    out = tmp_path / "o"
    out.mkdir()
    shutil.copytree(two / "part-00000-of-00002", out / "part-00000-of-00002")
    cases = [
        (["--num-processes", "3", "--process-id", "1"], "holds part-00000-of-00002, a part of "
         "a 2-process run; this is --num-processes 3: give --num-processes 2, or a new folder"),
        (["--num-processes", "2", "--process-id", "1", "--text-len", "4"],
         "part-00000-of-00002 in {out} was made with text_len=8, this run has text_len=4"),
    ]
    for extra, words in cases:
        assert main(_args(clips, out, *extra)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words.format(out=out) in err[0], (extra, err)
    (out / "notes.txt").write_text("mine")
    assert main(_args(clips, out, "--num-processes", "2", "--process-id", "1")) == 2
    assert "holds files that are no parts of a 2-process run (notes.txt)" in \
        capsys.readouterr().err
    # a finished plain dataset is not a place for parts
    assert main(_args(clips, two, "--num-processes", "4", "--process-id", "0")) == 2
    assert "already holds a dataset (meta.json, written by 2 process(es))" in \
        capsys.readouterr().err


def test_one_shape_runs_in_parts_too(clips, tmp_path, capsys):
    """Without buckets, the parts make today's version-1 dataset, files under the parts."""
    from ditax.train.data import read_meta

    v = tmp_path / "v"
    v.mkdir()
    for name in ("a", "b", "d"):
        shutil.copy(clips / f"{name}.mp4", v)
        shutil.copy(clips / f"{name}.txt", v)
    base = ["preprocess", str(v), str(tmp_path / "p"), "--model", "demo", "--text-len", "8",
            "--no-progress", "--height", "32", "--width", "32", "--frames", "5"]
    for k in (1, 0):
        assert main(base + ["--num-processes", "2", "--process-id", str(k)]) == 0
    meta = read_meta(tmp_path / "p")
    assert meta["version"] == 1 and meta["num_samples"] == 3 and meta["num_processes"] == 2
    assert meta["files"] == ["part-00000-of-00002/data-00000.array_record",
                             "part-00001-of-00002/data-00000.array_record"]
    assert meta["other_aspect_ratio"] == ["a.mp4", "b.mp4", "d.mp4"]
    assert (meta["width"], meta["height"], meta["frames"], meta["latent_shape"]) == (
        32, 32, 5, [16, 2, 8, 8])
    assert "meta.json written over 2 parts: 3 samples at 32x32, 5 frame(s)" in \
        capsys.readouterr().out
