"""``ditax preprocess`` and its output (issue 57; the reported runs): ``file:///abs/ds`` is the
local ``/abs/ds`` and the closing line says to train with that path (it wrote a relative folder
``file:/abs/ds`` under the current folder and named a source that did not exist);
``memory://ds`` is refused before any work, exit 2 (it said "wrote memory://ds" and the data
died with the process); a dataset the disk cannot take is exit 1, one line naming OUT and the
cause, nothing at OUT."""

from __future__ import annotations

import pytest

from ditax.cli import main
from full_disk import fill_disk
from shared_inputs import captioned_images

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return captioned_images(tmp_path_factory.mktemp("images"), 2)


def _preprocess(videos, out):
    return main(["preprocess", str(videos), str(out), "--model", "demo", "--height", "32",
                 "--width", "32", "--frames", "1", "--text-len", "8", "--no-progress"])


def test_a_file_url_is_the_local_folder(images, tmp_path, monkeypatch, capsys):
    from ditax.train.data import read_meta

    monkeypatch.chdir(tmp_path)
    assert _preprocess(images, f"file://{tmp_path}/ds") == 0      # the reported run
    said = capsys.readouterr().out
    assert f"wrote {tmp_path / 'ds'}; train with data.source={tmp_path / 'ds'}" in said, said
    assert read_meta(tmp_path / "ds")["num_samples"] == 2
    assert _preprocess(f"file://{images}", tmp_path / "ds2") == 0   # the clips' folder too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "ds2"]   # no folder "file:"


def test_memory_is_refused_before_any_work(images, capsys):
    assert _preprocess(images, "memory://t57/ds") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "ditax preprocess: error: output=memory://t57/ds: memory:// is this process's own "
        "in-memory store, gone when the command ends, so no other process"), err


def test_a_full_disk_is_exit_1_in_one_line_and_nothing_at_out(images, tmp_path, monkeypatch,
                                                              capsys):
    out = tmp_path / "ds"
    fill_disk(monkeypatch, after=0, match=".ds.partial")     # its meta.json fails
    assert _preprocess(images, out) == 1
    said = capsys.readouterr()
    err = said.err.strip().splitlines()
    assert len(err) == 1, said.err[-2000:]
    assert err[0] == (f"ditax preprocess: error: could not write {out}: no space left on "
                      f"device (the disk is full); free space there or write to another disk "
                      f"(nothing was left under that name)"), err[0]
    assert list(tmp_path.iterdir()) == [] and "wrote" not in said.out
