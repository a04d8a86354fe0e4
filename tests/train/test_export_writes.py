"""``ditax export`` on a full disk and with URLs (issue 57): a pipeline folder that cannot be
written whole is exit 1, one line naming ``--out`` and the cause, nothing at ``--out``;
``--out file:///abs`` is the local ``/abs``; ``--out memory://x`` (gone when the command ends)
is refused before any work, exit 2.

The run is a folder as ``ditax train`` leaves it (``config.yaml``, a finished checkpoint step
folder) whose checkpoint read is replaced by zeros of the model's shapes: what is tested is the
writing, not the reading (``test_export_run.py`` reads real checkpoints)."""

from __future__ import annotations


import jax
import numpy as np
import pytest

from ditax.cli import main
from full_disk import fill_disk


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from random_pipeline import folder_fields, random_pipeline_folder

    from ditax.config import load_config
    from ditax.config.loader import to_dict
    from ditax.train.resume import write_config

    root = tmp_path_factory.mktemp("export_writes")
    pipe = random_pipeline_folder(root / "pipe")
    fields = folder_fields(pipe)
    folder = root / "run"
    cfg = load_config("tiny", [*fields, f"init_from={pipe}", f"output_dir={folder}"])
    (folder / "checkpoints" / "3").mkdir(parents=True)
    write_config(folder, to_dict(cfg))
    return folder


@pytest.fixture
def zero_checkpoint(monkeypatch):
    def read_params(directory, step, abstract):
        return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract), []

    monkeypatch.setattr("ditax.train.checkpoint_read.read_params", read_params)


def test_a_full_disk_is_exit_1_in_one_line_and_nothing_at_out(run, tmp_path, monkeypatch,
                                                              capsys, zero_checkpoint):
    out = tmp_path / "exported"
    fill_disk(monkeypatch, after=0, match=".exported.partial")
    assert main(["export", str(run), "--out", str(out)]) == 1
    said = capsys.readouterr()
    err = said.err.strip().splitlines()
    assert len(err) == 1, said.err[-2000:]
    assert err[0].startswith(f"ditax export: error: could not write {out}: no space left on "
                             f"device (the disk is full); free space there"), err[0]
    assert err[0].endswith("(nothing was left under that name)"), err[0]
    assert list(tmp_path.iterdir()) == [] and "wrote" not in said.out


def test_file_urls_are_local_folders_and_memory_is_refused(run, tmp_path, monkeypatch, capsys,
                                                          zero_checkpoint):
    monkeypatch.chdir(tmp_path)
    assert main(["export", f"file://{run}", "--out", f"file://{tmp_path}/exported"]) == 0
    assert f"wrote {tmp_path / 'exported'}: transformer from checkpoint step 3" in \
        capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]   # no folder "file:"
    assert (tmp_path / "exported" / "transformer" / "config.json").is_file()

    assert main(["export", str(run), "--out", "memory://t57/exported"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "ditax export: error: --out=memory://t57/exported: memory:// is this process's own "
        "in-memory store, gone when the command ends"), err
