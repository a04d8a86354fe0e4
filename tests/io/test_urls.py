"""One URL rule (issue 57, item 2): every path-or-URL a user gives goes through
:func:`ditax.io.remote.urls.resolve` — ``file:///abs`` is the local ``/abs`` (never a relative
folder named ``file:``), ``memory://`` (fsspec's in-process store, gone when the command ends)
is refused, in one line naming the value and the fix, for every output another process reads
(a dataset, a run, an export) and accepted as an input, and a URL is refused where only a
local path works (a generated video, PNG frames)."""

from __future__ import annotations

import pathlib

import pytest

from ditax.errors import ConfigError, RequestError
from ditax.io.remote.urls import RemoteError, resolve

GONE = "memory:// is this process's own in-memory store, gone when the command ends"


def test_the_rule(tmp_path):
    assert resolve(f"file://{tmp_path}/ds", "output") == tmp_path / "ds"
    assert resolve(f"file://localhost{tmp_path}/ds", "output") == tmp_path / "ds"
    assert resolve("runs/a", "output_dir") == pathlib.Path("runs/a")
    assert resolve(" gs://bucket/ds ", "output") == "gs://bucket/ds"
    assert resolve("memory://ds", "data.source", output=False) == "memory://ds"
    cases = [
        (dict(value="memory://ds", what="output"), f"output=memory://ds: {GONE}"),
        (dict(value="simplecache::memory://ds", what="--out"), "memory:// is this process's"),
        (dict(value="file://host/ds", what="output"), "file:///ABSOLUTE/PATH (three slashes)"),
        (dict(value="gs:/bucket/ds", what="output"), "is no URL (one slash after 'gs:')"),
        (dict(value="gs://b/v.mp4", what="--output", remote=False),
         "--output=gs://b/v.mp4: this is written and read as a local path, not at a URL"),
        (dict(value="", what="output"), "output is empty"),
    ]
    for kw, words in cases:
        with pytest.raises(RemoteError) as e:
            resolve(**kw)
        assert words in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)
    with pytest.raises(RemoteError, match="give a local folder, file:///ABSOLUTE/PATH or a "
                                          "bucket URL"):
        resolve("memory://ds", "output")


def test_every_output_another_process_reads_refuses_memory(tmp_path):
    from ditax.io.remote.dataset_output import DatasetUpload, upload_dataset
    from ditax.io.remote.folders import check_new_url
    from ditax.io.remote.runs import RunFolder, check_run_url

    for refuse in (lambda: DatasetUpload("memory://t57/ds"),               # ditax preprocess
                   lambda: upload_dataset(tmp_path, "memory://t57/ds"),
                   lambda: RunFolder("memory://t57/run"),                   # output_dir
                   lambda: check_run_url("memory://t57/run"),
                   lambda: check_new_url("memory://t57/export", "--out", ConfigError)):
        with pytest.raises(ConfigError, match=GONE):
            refuse()


def test_file_urls_are_local_paths_everywhere(tmp_path, monkeypatch):
    from ditax.io.outputs import check_output_file, check_output_folder
    from ditax.io.remote.datasets import checked_source, local_dataset
    from ditax.io.remote.runs import RunFolder

    monkeypatch.chdir(tmp_path)
    run = RunFolder(f"file://{tmp_path}/run")
    assert run.local == tmp_path / "run" and not run.remote
    assert local_dataset(f"file://{tmp_path}/ds") == str(tmp_path / "ds")
    assert checked_source(f"file://{tmp_path}/ds") == str(tmp_path / "ds")
    assert check_output_file(f"file://{tmp_path}/v.mp4") == tmp_path / "v.mp4"
    assert check_output_folder(f"file://{tmp_path}/frames") == tmp_path / "frames"
    for check in (check_output_file, check_output_folder):
        with pytest.raises(RequestError, match="not at a URL; give a local path"):
            check("gs://bucket/v.mp4", "--output")
    assert list(tmp_path.iterdir()) == []         # nothing named file: made in the cwd
