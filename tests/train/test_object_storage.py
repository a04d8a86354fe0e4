"""Datasets and runs at URLs (issue 44 part 4, ditax.io.remote): a dataset read through this
host's mirror trains as the local copy does, ``ditax preprocess`` writes to a URL (meta.json
last), a run whose output_dir is a URL checkpoints there (orbax writes a local staging folder;
each finished step is uploaded, commit_success.txt last) and resumes from it bit for bit, a
half-uploaded checkpoint is never restored from, and a dozen wrong URLs are one line each.

``keptmem://`` (registered here) is ``memory://``'s in-process store standing for a bucket (no
OS path: what orbax cannot write, so the staging design is what runs; ``memory://`` itself is
refused for what another process reads, its store dying with the process); ``file://`` URLs
are the local paths they name. ``flakymem://`` is the same store with uploads that fail on
demand.
"""

import json
import os
import shutil
import uuid

import fsspec
import jax
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from ditax.cli import main as cli_main
from ditax.io.remote.dataset_output import upload_dataset
from ditax.io.remote.urls import ENV
from ditax.parallel.mesh import make_mesh
from ditax.train.checkpoint import CheckpointSaveError
from ditax.train.loop import train
from ditax.train.step import Trainer
from latent_datasets import run_cfg, write_dataset
from shared_inputs import captioned_images

pytestmark = pytest.mark.usefixtures("fast_compile")


class KeptMemory(MemoryFileSystem):
    """``memory://``'s store under another protocol: a bucket, as far as ditax can tell."""

    protocol = "keptmem"

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, str) and path.startswith(f"{cls.protocol}://"):
            path = path[len(f"{cls.protocol}://"):]
        return super()._strip_protocol(path)


class FlakyMemory(KeptMemory):
    """:class:`KeptMemory` whose upload of a path that holds ``fail_on`` fails halfway (the
    files before it arrived, it and those after did not)."""

    protocol = "flakymem"
    fail_on: str | None = None

    def put_file(self, lpath, rpath, **kw):
        if self.fail_on and self.fail_on in rpath:
            raise ConnectionError("connection reset by peer (simulated)")
        return super().put_file(lpath, rpath, **kw)


fsspec.register_implementation("keptmem", KeptMemory, clobber=True)
fsspec.register_implementation("flakymem", FlakyMemory, clobber=True)
MEM = fsspec.filesystem("memory")


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    """This module's host cache (mirrors, staging folders), and memory:// emptied after."""
    old = os.environ.get(ENV)
    path = tmp_path_factory.mktemp("remote_cache")
    os.environ[ENV] = str(path)
    yield path
    os.environ.pop(ENV) if old is None else os.environ.__setitem__(ENV, old)
    MEM.store.clear()
    MEM.pseudo_dirs[:] = [""]


def url(name: str, proto: str = "keptmem") -> str:
    return f"{proto}://t-{uuid.uuid4().hex[:8]}/{name}"


def forget(cache):
    """A fresh host: no mirror, no staging folder (what a rerun elsewhere starts from)."""
    for sub in ("datasets", "runs"):
        shutil.rmtree(cache / sub, ignore_errors=True)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds") / "latents")


@pytest.fixture(scope="module")
def remote_ds(dataset):
    u = url("latents")
    upload_dataset(dataset, u)
    return u


@pytest.fixture(scope="module")
def trainer(dataset):
    cfg = run_cfg("unused", dataset)
    return Trainer(cfg, make_mesh(cfg.mesh))


@pytest.fixture(scope="module")
def local_run(dataset, trainer, tmp_path_factory):
    """The reference: 4 steps on the local dataset into a local folder."""
    out = tmp_path_factory.mktemp("local") / "run"
    r = train(run_cfg(out, dataset, "steps=4"), trainer=trainer, progress=False)
    r.folder = out
    return r



def _same_state(a, b):
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _committed(run_url) -> list[int]:
    root = run_url.split("://", 1)[1]
    return sorted(int(p.split("/")[-2]) for p in MEM.find(f"/{root}/checkpoints")
                  if p.endswith("/commit_success.txt") and p.split("/")[-2].isdigit())


@pytest.fixture(scope="module")
def url_run(remote_ds, trainer, cache):
    """2 steps into a run at a URL, then, as on a new host (no mirror, no staging folder),
    the same run to 4 steps: ``(url, first, second, what each said)``."""
    run, said = url("run"), ([], [])
    b1 = train(run_cfg(run, remote_ds, "steps=2"), trainer=trainer, progress=False,
               say=said[0].append)
    committed = _committed(run)
    forget(cache)
    b2 = train(run_cfg(run, remote_ds, "steps=4"), trainer=trainer, progress=False,
               say=said[1].append)
    return run, b1, b2, ["\n".join(s) for s in said], committed


def test_url_dataset_and_url_run_match_the_local_ones_and_resume_bit_exactly(
        local_run, url_run, remote_ds, trainer, capsys):
    run, b1, b2, said, committed = url_run
    assert f"data.source={remote_ds}: downloading 3 files" in said[0]   # 2 record files + meta
    assert committed == [2]
    assert f"resuming from checkpoint step 2 in {run}/checkpoints" in said[1], said[1]
    assert b2.resumed_from == 2
    assert b1.losses + b2.losses == local_run.losses
    _same_state(local_run, b2)
    root = run.split("://", 1)[1]
    rows = [json.loads(line) for line in MEM.cat_file(f"/{root}/metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert MEM.isfile(f"/{root}/config.yaml") and MEM.find(f"/{root}/tb")
    assert _committed(run) == [2, 4]
    # the mirror is reused (verified by size, nothing downloaded) by a run on the same host
    train(run_cfg(url("run2"), remote_ds, "steps=1"), trainer=trainer, progress=False)
    assert "downloading" not in capsys.readouterr().out


def test_file_urls_are_the_local_paths(local_run, dataset, trainer, tmp_path):
    out = tmp_path / "run"
    r = train(run_cfg(f"file://{out}", f"file://{os.path.abspath(dataset)}", "steps=4"),
              trainer=trainer, progress=False)
    assert r.losses == local_run.losses
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2", "4"]


def test_a_half_uploaded_checkpoint_is_never_resumed_from(local_run, remote_ds, trainer,
                                                          cache, capsys):
    run = url("run", "flakymem")
    FlakyMemory.fail_on = "/checkpoints/4/state/"   # step 4's upload dies halfway
    try:
        with pytest.raises(CheckpointSaveError) as e:
            train(run_cfg(run, remote_ds, "steps=4"), trainer=trainer, progress=False)
    finally:
        FlakyMemory.fail_on = None
    msg = str(e.value)
    assert f"checkpoint step 4 could not be uploaded to {run}/checkpoints" in msg, msg
    assert "resumes from checkpoint step 2" in msg and len(msg.splitlines()) == 1
    root = run.split("://", 1)[1]
    assert MEM.isfile(f"/{root}/checkpoints/4/_CHECKPOINT_METADATA")    # half of it is there
    assert _committed(run) == [2]
    forget(cache)
    capsys.readouterr()
    r = train(run_cfg(run, remote_ds, "steps=4"), trainer=trainer, progress=False)
    said = capsys.readouterr().out
    assert f"ignoring incomplete upload {run}/checkpoints/4 (no commit_success.txt" in said
    assert r.resumed_from == 2 and r.losses == local_run.losses[2:]
    _same_state(local_run, r)
    assert _committed(run) == [2, 4]
    # a committed step that no longer reads: the older one is fetched, the bad one moved aside
    for f in MEM.find(f"/{root}/checkpoints/4/state"):
        MEM.pipe_file(f, b"garbage")
    forget(cache)
    capsys.readouterr()
    r = train(run_cfg(run, remote_ds, "steps=5"), trainer=trainer, progress=False)
    said = capsys.readouterr().out
    assert "step 4 in " + run + "/checkpoints is incomplete or corrupted" in said, said
    assert "downloading step 2" in said and "moved it to 4.corrupt" in said
    assert r.resumed_from == 2 and r.losses[:2] == local_run.losses[2:]
    assert MEM.isdir(f"/{root}/checkpoints/4.corrupt") and _committed(run) == [4, 5]


def _preprocess(videos, out, *extra):
    return cli_main(["preprocess", str(videos), out, "--model", "demo", "--height", "32",
                     "--width", "32", "--frames", "1", "--text-len", "8", "--no-progress",
                     *extra])


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return captioned_images(tmp_path_factory.mktemp("videos"), 3)


@pytest.fixture(scope="module")
def preprocessed(images):
    """``ditax preprocess`` (one process) of the three images to a URL: ``(url, stdout)``."""
    import contextlib
    import io

    out, said = url("latents"), io.StringIO()
    with contextlib.redirect_stdout(said):
        assert _preprocess(images, out) == 0
    return out, said.getvalue()


def test_preprocess_to_a_url_then_train_from_it(preprocessed, images, trainer, cache, capsys):
    out, said = preprocessed
    assert f"train with data.source={out}" in said, said
    root = out.split("://", 1)[1]
    meta = json.loads(MEM.cat_file(f"/{root}/meta.json"))
    assert meta["num_samples"] == 3 and all(MEM.isfile(f"/{root}/{f}") for f in meta["files"])
    assert not (cache / "preprocess").exists() or not any((cache / "preprocess").rglob("*.array_record"))
    # the demo's latents (16 channels, 64-wide text) fit the tiny model: its trainer retraces
    r = train(run_cfg(url("run"), out, "steps=1"), trainer=trainer, progress=False)
    assert r.step == 1 and np.isfinite(r.losses).all()
    # a URL that holds a dataset now: refused, one line, nothing encoded
    assert _preprocess(images, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"output {out} already holds a dataset (meta.json)" in err[0]


def _records(source) -> list[bytes]:
    """Every record of the dataset at ``source`` (a URL: its mirror), in record order."""
    import grain

    from ditax.io.remote.datasets import local_dataset
    from ditax.train.data import read_meta

    folder = local_dataset(source)
    meta = read_meta(folder)
    src = grain.sources.ArrayRecordDataSource([os.path.join(folder, f) for f in meta["files"]])
    return [src[i] for i in range(len(src))]


def test_a_preprocess_of_two_processes_to_a_url_is_the_dataset_of_one(preprocessed, images,
                                                                       capsys):
    one, two = preprocessed[0], url("two")
    parts = ("--num-processes", "2")
    assert _preprocess(images, two, *parts, "--process-id", "1") == 0
    said = capsys.readouterr().out
    root = two.split("://", 1)[1]
    assert f"wrote {two}/part-00001-of-00002 (1 of 2 parts there)" in said, said
    assert MEM.isfile(f"/{root}/part-00001-of-00002/part.json")
    assert not MEM.exists(f"/{root}/meta.json")         # no half dataset for a reader
    _refused(["train", "tiny", f"data.source={two}"], "has no meta.json",
             "upload has not finished")
    _refused(["preprocess", str(images), two, "--model", "demo", "--num-processes", "3",
              "--process-id", "0"], "a part of a 2-process run")
    assert _preprocess(images, two, *parts, "--process-id", "0") == 0
    assert f"wrote {two}; train with data.source={two}" in capsys.readouterr().out
    assert json.loads(MEM.cat_file(f"/{root}/meta.json"))["num_processes"] == 2
    assert _records(two) == _records(one)
    assert _preprocess(images, two, *parts, "--process-id", "1") == 0    # complete: nothing
    assert f"{two} is complete (meta.json over 2 parts)" in capsys.readouterr().out


def test_a_bucketed_dataset_at_a_url_reads_as_the_local_one(tmp_path):
    """A version-2 dataset (bucket subfolders, null text) through the mirror: the same
    batches as the local copy."""
    from bucket_datasets import write_bucketed

    from ditax.io.remote.datasets import local_source
    from ditax.train.batches import BatchIterator

    local, _ = write_bucketed(tmp_path / "b", {"64x64x5": 5, "128x64x5": 3}, null=True)
    remote = url("buckets")
    upload_dataset(local, remote)
    cfg = run_cfg("unused", remote, "batch_size=2", "data.text_dropout=0.5")
    got = BatchIterator(local_source(cfg), 0, 1)
    want = BatchIterator(run_cfg("unused", local, "batch_size=2", "data.text_dropout=0.5"), 0, 1)
    for _ in range(6):
        a, b = next(got), next(want)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def _refused(args, *needles):
    """``ditax ARGS`` exits 2 with one line on stderr that holds every needle."""
    import io
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli_main(args)
    lines = err.getvalue().strip().splitlines()
    assert rc == 2 and len(lines) == 1, (rc, lines)
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_wrong_urls_are_one_line_each_before_anything_loads(remote_ds, tmp_path):
    bad = url("bad")
    root = bad.split("://", 1)[1]
    MEM.pipe_file(f"/{root}/nometa/data-00000.array_record", b"x")
    MEM.pipe_file(f"/{root}/garbled/meta.json", b"{not json")
    MEM.pipe_file(f"/{root}/short/meta.json", json.dumps(
        {"format": "ditax-latents", "version": 1, "files": ["data-00000.array_record"]}).encode())
    MEM.pipe_file(f"/{root}/other/photo.jpg", b"x")
    MEM.pipe_file(f"/{root}/a-file", b"x")

    def train_with(*kv):
        return ["train", "tiny", "steps=1", *kv]

    ok_out = f"output_dir={tmp_path / 'run'}"
    cases = [
        (train_with("data.source=gs://bucket/latents", ok_out),
         ["data.source=gs://bucket/latents", "pip install gcsfs"]),
        (train_with("data.source=s3://bucket/latents", ok_out), ["pip install s3fs"]),
        (train_with("data.source=nosuchfs://bucket/latents", ok_out),
         ["unknown protocol 'nosuchfs://'"]),
        (train_with("data.source=memory://", ok_out), ["names no bucket or folder"]),
        (train_with("data.source=gs:/bucket/latents", ok_out),
         ["is no URL (one slash", "gs://bucket/latents"]),
        (train_with("data.source=file://host/latents", ok_out), ["file:///ABSOLUTE/PATH"]),
        (train_with(f"data.source={bad}/nothing", ok_out), ["does not exist"]),
        (train_with(f"data.source={bad}/nometa", ok_out),
         ["has no meta.json", "upload has not finished"]),
        (train_with(f"data.source={bad}/garbled", ok_out), ["is not valid JSON"]),
        (train_with(f"data.source={bad}/short", ok_out),
         ["missing there: ['data-00000.array_record']"]),
        (train_with(f"data.source={bad}/a-file", ok_out), ["is a file, not a dataset folder"]),
        (train_with("output_dir=gs://bucket/run"), ["output_dir=gs://bucket/run",
                                                    "pip install gcsfs"]),
        (train_with(f"output_dir={remote_ds}"), ["holds a dataset (meta.json), not a run"]),
        (train_with(f"output_dir={bad}/other"), ["non-empty folder that holds no run"]),
        (train_with(f"output_dir={bad}/a-file"), ["is a file, not a folder"]),
        (["train-vae", f"output_dir={bad}/vae", f"data.source={tmp_path}"],
         ["writes a local folder only"]),
        (["preprocess", str(tmp_path), "s3://bucket/latents", "--model", "demo"],
         ["pip install s3fs"]),
        (["preprocess", str(tmp_path), remote_ds, "--model", "demo"],
         ["already holds a dataset (meta.json)"]),
        (["preprocess", str(tmp_path), f"{bad}/other", "--model", "demo"], ["is not empty"]),
    ]
    for args, needles in cases:
        _refused(args, *needles)
    assert not MEM.exists(f"/{root}/vae")


def test_a_run_of_several_processes_is_refused_at_a_url(monkeypatch):
    from ditax.errors import ConfigError
    from ditax.train.resume import open_run_folder

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"a run of 2 processes cannot checkpoint to a URL.*"
                                          r"gcsfuse mount"):
        open_run_folder(url("run"))


def test_export_reads_a_url_run_and_writes_to_a_url(url_run, local_run, tmp_path, capsys):
    """The URL run's step 4 exported to a URL: the base's components, the checkpoint's
    transformer (the local reference run's weights, bit for bit: its resume was exact)."""
    from random_pipeline import random_pipeline_folder

    run = url_run[0]
    base = random_pipeline_folder(tmp_path / "base")    # the tiny model's architecture:
    config = json.loads((base / "transformer" / "config.json").read_text())
    (base / "transformer" / "config.json").write_text(json.dumps({**config, "freq_dim": 32}))
    out = url("exported")
    assert cli_main(["export", run, "--out", out, "--base", str(base)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}: transformer from checkpoint step 4 of {run}" in said, said
    root = out.split("://", 1)[1]
    got = sorted(p[len(root) + 2:] for p in MEM.find(f"/{root}"))
    assert {"model_index.json", "transformer/config.json", "vae/config.json"} <= set(got), got
    from safetensors.numpy import load

    from ditax.io.convert import export
    from ditax.models.base import model_family
    from ditax.train.checkpoint_read import read_params
    from ditax.train.export import _abstract_params

    family = model_family(run_cfg("x", "y").model)      # step 4 of the URL run, bit for bit
    want = export(family.weight_table(), read_params(
        local_run.folder / "checkpoints", 4, _abstract_params(family)[0])[0])
    have = {}
    for name in got:
        if name.startswith("transformer/") and name.endswith(".safetensors"):
            have.update(load(MEM.cat_file(f"/{root}/{name}")))
    assert have.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(have[k], np.asarray(want[k]), err_msg=k)
    _refused(["export", run, "--out", out, "--base", str(base)],
             f"--out {out} exists and is not an empty folder")
    _refused(["export", run, "--out", url("x"), "--base", str(base), "--link"],
             "drop --link or give a local --out")
    _refused(["export", url("nothing"), "--out", str(tmp_path / "x")], "does not exist")
