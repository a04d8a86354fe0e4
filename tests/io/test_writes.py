"""Every writer is checked (issue 57, item 1): an mp4 whose ffmpeg failed — even one that exits
0 after ``Error writing trailer: No space left on device``, as the reported run did — PNG
frames, a PNG, a WAV, a sound track muxed in, extra arrays, a safetensors folder and a
dataset's ArrayRecord files, each on a disk that fills up, are one :class:`WriteFailed` line
naming the file asked for and the cause; nothing is left under that name (no ``.partial``
either) and a file that was there before is unchanged. The outputs of one request are renamed
together: frames that fail leave no mp4 behind (the reported ``--frames-dir`` run).

The full disk is faked at the lowest write (:mod:`full_disk`: Python's ``open``, ffmpeg's
exit status and lines) or made real without root: ffmpeg writing into ``/dev/full`` (ENOSPC),
and a file-size limit (``RLIMIT_FSIZE``, EFBIG) for ffmpeg and the C++ / Rust writers."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from ditax.io.outputs import WriteFailed, atomic_file, staged
from full_disk import fake_ffmpeg, file_size_limit, fill_disk

OLD = b"the video that was there before"


def _video(frames=5):
    return np.random.default_rng(0).random((frames, 32, 48, 3)).astype(np.float32)


def _left(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("kind, said", [
    ("trailer", "no space left on device (the disk is full); ffmpeg: Error writing trailer: "
                "No space left on device; free space there"),
    ("exit1", "ffmpeg: Error writing trailer: No space left on device (exit status 1)"),
    ("midway", "ffmpeg: Error submitting a packet to the muxer: No space left on device "
               "(exit status 228)"),
    ("dev_full", "no space left on device (the disk is full); ffmpeg: "),
    ("ulimit", "a file outgrew the file-size limit (ulimit -f); ffmpeg: "),
])
def test_an_mp4_ffmpeg_could_not_finish_is_one_line_and_the_old_file_stays(
        tmp_path, monkeypatch, kind, said):
    from ditax.io.video import write_mp4

    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg(tmp_path, kind))
    out = tmp_path / "out"
    out.mkdir()
    (out / "v.mp4").write_bytes(OLD)
    with pytest.raises(WriteFailed) as e:
        write_mp4(out / "v.mp4", _video(17))
    msg = str(e.value)
    assert msg.startswith(f"could not write {out / 'v.mp4'}: "), msg
    assert said in msg and msg.endswith(f"({out / 'v.mp4'} is as it was before)"), msg
    assert len(msg.splitlines()) == 1
    assert _left(out) == ["v.mp4"] and (out / "v.mp4").read_bytes() == OLD
    # a new name: nothing at all is left
    with pytest.raises(WriteFailed, match="nothing was left under that name"):
        write_mp4(out / "new.mp4", _video(17))
    assert _left(out) == ["v.mp4"]


def test_a_sound_track_that_could_not_be_muxed_leaves_the_mp4_as_it_was(tmp_path,
                                                                          monkeypatch):
    from ditax.io.audio import AudioTrack, mux_into_mp4
    from ditax.io.video import write_mp4

    mp4 = write_mp4(tmp_path / "v.mp4", _video())
    before = mp4.read_bytes()
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg(tmp_path, "trailer"))
    track = AudioTrack(np.zeros((1, 8000), np.float32), 16000)
    with pytest.raises(WriteFailed, match=r"could not write .*v\.mp4: no space left"):
        mux_into_mp4(mp4, track)
    assert mp4.read_bytes() == before and _left(tmp_path) == ["ffmpeg-trailer", "v.mp4"]
    with pytest.raises(WriteFailed, match="nothing was left"):      # the sound in the write
        write_mp4(tmp_path / "s.mp4", _video(), audio=track)
    assert not (tmp_path / "s.mp4").exists()


def _frames(path):
    from ditax.io.video import write_frames

    write_frames(path, _video())


def _png(path):
    from ditax.io.images import write_png

    write_png(path, _video()[0])


def _wav(path):
    from ditax.io.audio import AudioTrack, write_wav

    write_wav(path, AudioTrack(np.zeros((2, 40000), np.float32), 16000))


def _extras(path):
    from ditax.io.outputs import write_extras

    write_extras(path.with_name("v.mp4"), {"latents": np.ones((64, 64), np.float32)})


def _weights(path):
    from ditax.io.convert import Row, Table
    from ditax.io.export import save_folder

    save_folder(path, "model.safetensors", Table("t", (Row(("w",), "w"),)),
                {"w": np.ones(4, np.float32)}, {"hidden": 8})


# (writer, the path it is given, the path the failure names, where the fake disk fills up)
WRITERS = {
    "frames": (_frames, "frames", "frames", ".frames.partial"),
    "png": (_png, "x.png", "x.png", ".partial"),
    "wav": (_wav, "x.wav", "x.wav", ".partial"),
    "extras": (_extras, "v.latents.npy", "v.latents.npy", ".partial"),
    # the weights are written whole (Rust); the config.json beside them fails: neither stays
    "weights": (_weights, "folder", "folder/config.json", "config.partial"),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize("code, words", [
    (errno.ENOSPC, "no space left on device (the disk is full); free space there or write "
                   "to another disk"),
    (errno.EDQUOT, "the disk quota is used up; raise the quota or free space under it"),
    (errno.EACCES, "permission denied; write to a folder you may write to"),
])
def test_each_writer_on_a_full_disk_is_one_line_naming_its_file(tmp_path, monkeypatch, name,
                                                                code, words):
    write, given, named, match = WRITERS[name]
    fill_disk(monkeypatch, after=10, match=match, code=code)
    with pytest.raises(WriteFailed) as e:
        write(tmp_path / given)
    assert str(e.value) == (f"could not write {tmp_path / named}: {words} (nothing was left "
                            f"under that name)"), str(e.value)
    assert e.value.errno == code and e.value.path == tmp_path / named
    assert _left(tmp_path / ("folder" if name == "weights" else "")) == []


def test_an_existing_file_is_kept_when_its_replacement_fails(tmp_path, monkeypatch):
    (tmp_path / "x.png").write_bytes(OLD)
    fill_disk(monkeypatch, after=10)
    with pytest.raises(WriteFailed, match=r"x\.png is as it was before\)$"):
        _png(tmp_path / "x.png")
    assert _left(tmp_path) == ["x.png"] and (tmp_path / "x.png").read_bytes() == OLD


def test_one_requests_outputs_appear_together_or_not_at_all(tmp_path, monkeypatch):
    """The reported ``--frames-dir`` run: the frames fail after the mp4 was written whole;
    the mp4 is not left at its name either (the old one stays), nor the extras."""
    from ditax.io.results import write_result

    (tmp_path / "v.mp4").write_bytes(OLD)
    fill_disk(monkeypatch, after=2000, match=".frames.partial")
    with pytest.raises(WriteFailed) as e:
        write_result(tmp_path / "v.mp4", _video(), extras={"latents": np.ones(3)},
                     frames_dir=tmp_path / "frames")
    assert str(e.value).startswith(f"could not write {tmp_path / 'frames'}: no space left")
    assert _left(tmp_path) == ["v.mp4"] and (tmp_path / "v.mp4").read_bytes() == OLD
    monkeypatch.undo()
    extras = write_result(tmp_path / "v.mp4", _video(), extras={"latents": np.ones(3)},
                          frames_dir=tmp_path / "frames")
    assert extras == [tmp_path / "v.latents.npy"]
    assert _left(tmp_path) == ["frames", "v.latents.npy", "v.mp4"]
    assert len(list((tmp_path / "frames").iterdir())) == 5


def test_an_error_the_disk_reports_only_at_the_flush_is_caught(tmp_path, monkeypatch):
    """A file system that reports a failed write late (NFS, a quota at writeback): the flush
    before the rename fails, so nothing is renamed."""
    def failing_fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(WriteFailed, match=r"^could not write .*x\.png: an input/output error "
                                          r"of the disk; check the disk"):
        _png(tmp_path / "x.png")
    assert _left(tmp_path) == []


def test_c_and_rust_writers_past_a_file_size_limit(tmp_path):
    """A real kernel failure (EFBIG) inside ArrayRecord (C++) and safetensors (Rust): the
    dataset folder and the weights folder are named, nothing is left."""
    from ditax.io.outputs import atomic_folder
    from ditax.train.data_writer import DatasetWriter

    rng = np.random.default_rng(0)
    with pytest.raises(WriteFailed) as e, file_size_limit(8192):
        with atomic_folder(tmp_path / "ds") as tmp:
            w = DatasetWriter(tmp)
            for _ in range(8):
                w.add(rng.random((4, 1, 8, 8), np.float32), rng.random((8, 64), np.float32))
            w.close()
    assert str(e.value).startswith(f"could not write {tmp_path / 'ds'}: a file outgrew the "
                                   f"file-size limit (ulimit -f)"), str(e.value)
    with pytest.raises(WriteFailed, match=r"folder/model\.safetensors: a file outgrew"), \
            file_size_limit(8192):
        from ditax.io.convert import Row, Table
        from ditax.io.export import save_folder

        save_folder(tmp_path / "folder", "model.safetensors", Table("t", (Row(("w",), "w"),)),
                    {"w": rng.random((64, 64), np.float32)}, {})
    assert _left(tmp_path) == ["folder"] and _left(tmp_path / "folder") == []


def test_what_is_no_write_failure_passes_through_untouched(tmp_path):
    """A bad request, a missing input, an interrupt inside a write: raised as they are (not
    called a write failure), the temporary removed."""
    for error in (ValueError("bad size"), FileNotFoundError(errno.ENOENT, "gone", "/in.mp4"),
                  KeyboardInterrupt()):
        with pytest.raises(type(error)) as e:
            with atomic_file(tmp_path / "x.bin") as tmp:
                tmp.write_bytes(b"half")
                raise error
        assert e.value is error
        assert _left(tmp_path) == []
    with staged() as stage:         # and a whole write is renamed
        stage.file(tmp_path / "x.bin").write_bytes(b"whole")
    assert (tmp_path / "x.bin").read_bytes() == b"whole"
