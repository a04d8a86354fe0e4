"""Which file a failed staged write names (:meth:`ditax.io.outputs.Staging.failure`), and the
last writers put on the staged path: a pipeline folder's ``ditax_sample.json``
(:func:`~ditax.pipelines.sample_defaults.write_sample_defaults`) and a contact sheet
(:func:`~ditax.synthetic.sheet.contact_sheet`).

- A later output whose folder cannot be made (a plain file ``sub`` where ``sub/b.bin`` needs a
  folder) is named by its own path, not by the output staged before it; that one keeps what
  it had.
- An os error that names no file (Python's ``write`` on a full disk: ``/dev/full`` gives the
  kernel's real ENOSPC) names the output being written when it came, not the last one begun.
- On a disk that fills up (:func:`full_disk.fill_disk`) each writer is one
  :class:`WriteFailed` line naming its file; nothing is left under that name (no
  ``.partial`` either) and a file that was there before is unchanged."""

from __future__ import annotations

import errno
import os

import pytest

from ditax.io.outputs import WriteFailed, staged
from full_disk import fill_disk

OLD = b"what was there before"
FULL = "no space left on device (the disk is full); free space there or write to another disk"
NOTHING = "(nothing was left under that name)"


def _files(folder) -> list[str]:
    """Every entry under ``folder`` (hidden temporaries included), relative, sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _kept(path) -> str:
    return f"({path} is as it was before)"


def _disk_full_write() -> None:
    """A write the kernel refuses with ENOSPC, as Python reports it: no file name."""
    with open("/dev/full", "wb", buffering=0) as f:
        f.write(b"x")


# --- which output a failure names

@pytest.mark.parametrize("later, making", [("sub/b.bin", "sub"),
                                           ("sub/deeper/b.bin", "sub/deeper")])
def test_a_later_file_whose_folder_cannot_be_made_is_named_by_its_own_path(tmp_path, later,
                                                                           making):
    (tmp_path / "a.bin").write_bytes(OLD)
    (tmp_path / "sub").write_bytes(b"a plain file")
    with pytest.raises(WriteFailed) as e:
        with staged() as stage:
            stage.file(tmp_path / "a.bin").write_bytes(b"new")
            stage.file(tmp_path / later).write_bytes(b"b")
    assert str(e.value) == (f"could not write {tmp_path / later}: a part of its path is a "
                            f"file, not a folder; while making {tmp_path / making}; move it or "
                            f"write elsewhere {NOTHING}"), str(e.value)
    assert e.value.path == tmp_path / later
    # renamed together: a.bin, written whole under its temporary, is not replaced either
    assert _files(tmp_path) == ["a.bin", "sub"] and (tmp_path / "a.bin").read_bytes() == OLD
    assert (tmp_path / "sub").read_bytes() == b"a plain file"


def test_a_write_failure_another_writer_raised_keeps_its_own_file(tmp_path):
    """A :class:`WriteFailed` of a file this stage never began, wrapped by a writer's own
    error: named as it was (not the output staged last)."""
    other = tmp_path / "cache" / "x.bin"
    with pytest.raises(WriteFailed) as e:
        with staged() as stage:
            stage.file(tmp_path / "a.bin").write_bytes(b"new")
            try:
                raise WriteFailed(other, errno.EDQUOT)
            except WriteFailed as inner:
                raise RuntimeError("the writer gave up") from inner
    assert str(e.value) == (f"could not write {other}: the disk quota is used up; raise the "
                            f"quota or free space under it {NOTHING}"), str(e.value)
    assert _files(tmp_path) == []


@pytest.mark.parametrize("written_last", ["a.bin", "b.bin"])
def test_an_error_naming_no_file_names_the_output_being_written(tmp_path, written_last):
    """Both outputs are begun first; the one written to last when the disk fills up is named
    (the one begun last, ``b.bin``, was the only one ever named). The other's temporary is
    dated 10 s back: file-system clocks are coarser than two quick writes."""
    (tmp_path / "b.bin").write_bytes(OLD)
    with pytest.raises(WriteFailed) as e:
        with staged() as stage:
            tmps = {name: stage.file(tmp_path / name) for name in ("a.bin", "b.bin")}
            done = "b.bin" if written_last == "a.bin" else "a.bin"
            tmps[done].write_bytes(b"whole")
            st = tmps[done].stat()
            os.utime(tmps[done], ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))
            tmps[written_last].write_bytes(b"half")
            _disk_full_write()
    named = tmp_path / written_last
    kept = _kept(named) if written_last == "b.bin" else NOTHING
    assert str(e.value) == f"could not write {named}: {FULL} {kept}", str(e.value)
    assert e.value.errno == errno.ENOSPC and e.value.path == named
    assert _files(tmp_path) == ["b.bin"] and (tmp_path / "b.bin").read_bytes() == OLD


def test_an_error_naming_no_file_names_a_folder_whose_files_were_written_last(tmp_path):
    """A folder output is as new as the newest file in it: frames written after the mp4."""
    with pytest.raises(WriteFailed) as e:
        with staged() as stage:
            frames = stage.folder(tmp_path / "frames")
            mp4 = stage.file(tmp_path / "v.mp4")
            mp4.write_bytes(b"whole")
            st = mp4.stat()
            os.utime(mp4, ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))
            os.utime(frames, ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))
            (frames / "frame_00000.png").write_bytes(b"half")
            _disk_full_write()
    assert str(e.value) == f"could not write {tmp_path / 'frames'}: {FULL} {NOTHING}"
    assert _files(tmp_path) == []


# --- writers put on the staged path

def test_a_folders_sample_defaults_on_a_full_disk_stay_as_they_were(tmp_path, monkeypatch):
    from ditax.pipelines.sample_defaults import FILE, read_sample_defaults, write_sample_defaults

    values = {"height": 64, "width": 64, "num_frames": 17, "guidance_scale": 8.0}
    path = write_sample_defaults(tmp_path, values)
    before = path.read_bytes()
    fill_disk(monkeypatch, after=4, match=".ditax_sample.partial")
    with pytest.raises(WriteFailed) as e:
        write_sample_defaults(tmp_path, {**values, "height": 32})
    assert str(e.value) == f"could not write {path}: {FULL} {_kept(path)}", str(e.value)
    assert e.value.errno == errno.ENOSPC and e.value.path == path
    assert _files(tmp_path) == [FILE] and path.read_bytes() == before
    with pytest.raises(WriteFailed, match=rf"{FILE}: no space left on device .*{NOTHING}"):
        write_sample_defaults(tmp_path / "new", values)
    assert not (tmp_path / "new" / FILE).exists()
    monkeypatch.undo()
    assert write_sample_defaults(tmp_path, {**values, "height": 32}) == path
    assert read_sample_defaults(tmp_path) == {**values, "height": 32}
    assert _files(tmp_path) == [FILE, "new"]


def test_a_contact_sheet_on_a_full_disk_leaves_the_old_sheet(tmp_path, monkeypatch):
    from PIL import Image

    from ditax.synthetic import clips, sheet, vocab

    combos = vocab.all_combinations()[:2]
    videos = [clips.make_clip(i, c, height=16, width=16, num_frames=3)[0]
              for i, c in enumerate(combos)]
    prompts = [c.prompt for c in combos]
    path = tmp_path / "s.png"
    path.write_bytes(OLD)
    fill_disk(monkeypatch, after=10)
    with pytest.raises(WriteFailed) as e:
        sheet.contact_sheet(videos, prompts, path, frames=2)
    assert str(e.value) == f"could not write {path}: {FULL} {_kept(path)}", str(e.value)
    assert _files(tmp_path) == ["s.png"] and path.read_bytes() == OLD
    with pytest.raises(WriteFailed, match=rf"new\.png: no space left on device .*{NOTHING}"):
        sheet.contact_sheet(videos, prompts, tmp_path / "new.png", frames=2)
    assert _files(tmp_path) == ["s.png"]
    monkeypatch.undo()
    assert sheet.contact_sheet(videos, prompts, path, frames=2) == path
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size == sheet.sheet_size([v.shape for v in videos], 2, 2)
    assert _files(tmp_path) == ["s.png"]


def test_sample_defaults_written_into_a_staged_folder_name_the_folder(tmp_path, monkeypatch):
    """The recipes write the file into a pipeline folder being staged (its temporary): the
    failure names the folder asked for, never its hidden temporary, and leaves nothing."""
    from ditax.io.outputs import atomic_folder
    from ditax.pipelines.sample_defaults import write_sample_defaults

    fill_disk(monkeypatch, after=4, match=".ditax_sample.partial")
    with pytest.raises(WriteFailed) as e:
        with atomic_folder(tmp_path / "model") as tmp:
            (tmp / "model_index.json").write_text("{}")
            write_sample_defaults(tmp, {"height": 64})
    assert str(e.value) == f"could not write {tmp_path / 'model'}: {FULL} {NOTHING}"
    assert _files(tmp_path) == []


def test_a_lock_file_the_disk_cannot_take_is_one_line(tmp_path, monkeypatch):
    """The host lock of a cache folder on a full disk: WriteFailed naming the lock file (exit
    1 as every failed write), not a bare OSError; a folder that takes it still locks."""
    import builtins
    import errno

    from ditax.io.outputs import WriteFailed
    from ditax.io.remote.transfer import host_lock

    real = builtins.open

    def full(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)
    with pytest.raises(WriteFailed, match=rf"^could not write {tmp_path / 'run.lock'}: no "
                                          rf"space left on device") as e:
        with host_lock(tmp_path / "run"):
            pass
    assert e.value.errno == errno.ENOSPC and "\n" not in str(e.value)
    monkeypatch.undo()
    with host_lock(tmp_path / "run"):
        assert (tmp_path / "run.lock").exists()
