"""Every writer is checked, the rest of them (issue 57, item 1): LoRA exports, a run's
``config.yaml``, a student's ``ditax_sample.json``, synthetic clip datasets and files
downloaded from a URL into this host's cache. On a disk that fills up each is one
:class:`WriteFailed` line naming the file asked for and the cause, nothing is left under that
name (no ``.partial`` either) and a file that was there before is unchanged. A download that
fills the cache's disk is exit 1 naming the cache file (it was a ``RemoteError``, exit 2);
a failure of the store itself is still a ``RemoteError``.

The full disk is faked at the lowest write (:mod:`full_disk`: Python's ``open``, ffmpeg's
error line) or made real with a file-size limit (EFBIG) for the Rust safetensors writer and
for fsspec's downloads."""

from __future__ import annotations

import contextlib
import errno
import json
import uuid

import fsspec
import numpy as np
import pytest

from ditax.io.outputs import WriteFailed
from ditax.lora.export import ORIGINAL_FILE, PEFT_FILE, SAMPLE_FILE
from full_disk import fake_ffmpeg, file_size_limit, fill_disk

OLD = b"what was there before"
FULL = "no space left on device (the disk is full); free space there or write to another disk"
NOTHING = "(nothing was left under that name)"
STUDENT = {"num_inference_steps": 4, "guidance_scale": 1.0, "scheduler": "euler",
           "flow_shift": 5.0, "sigmas": [1.0, 0.75, 0.5, 0.25]}
MEM = fsspec.filesystem("memory")


def _files(folder) -> list[str]:
    """Every file under ``folder`` (hidden temporaries included), relative, sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _kept(path) -> str:
    return f"({path} is as it was before)"


# --- LoRA exports (ditax.lora.export.save_lora) and a student's ditax_sample.json

def _lora(folder, sample=STUDENT):
    """A Wan LoRA on the self-attention queries of 4 layers (rank 2, width 320: 20 KiB a
    file), exported with its sampling settings."""
    from ditax.lora.export import save_lora
    from ditax.models import registry
    from ditax.models.wan.convert import weight_table

    rng = np.random.default_rng(0)
    params = {"blocks": {"attn1": {"to_q": {
        "lora_down": rng.standard_normal((4, 2, 320)).astype(np.float32),
        "lora_up": rng.standard_normal((4, 2, 320)).astype(np.float32)}}}}
    return save_lora(folder, params, weight_table(4, True, head_dim=64), 2, 2.0,
                     names=registry.spec("wan").lora_names_object(), sample=sample)


@pytest.mark.parametrize("fails", ["sample_json", "weights"])
def test_a_lora_export_on_a_full_disk_leaves_the_old_files_and_no_new_one(tmp_path,
                                                                         monkeypatch, fails):
    out = tmp_path / "lora"
    out.mkdir()
    (out / PEFT_FILE).write_bytes(OLD)
    if fails == "sample_json":      # Python's write of the json, after both weight files
        fill_disk(monkeypatch, after=10, match=".ditax_sample.partial")
        limit, expected = contextlib.nullcontext(), f"{out / SAMPLE_FILE}: {FULL} {NOTHING}"
    else:                           # the Rust writer of the first weight file (a real EFBIG)
        limit = file_size_limit(8192)
        expected = (f"{out / PEFT_FILE}: a file outgrew the file-size limit (ulimit -f); "
                    f"raise the limit (ulimit -f unlimited) {_kept(out / PEFT_FILE)}")
    with pytest.raises(WriteFailed) as e:
        with limit:
            _lora(out)
    assert str(e.value) == f"could not write {expected}", str(e.value)
    assert len(str(e.value).splitlines()) == 1
    assert _files(out) == [PEFT_FILE] and (out / PEFT_FILE).read_bytes() == OLD
    monkeypatch.undo()
    assert _lora(out) == [out / PEFT_FILE, out / ORIGINAL_FILE]
    assert _files(out) == sorted([PEFT_FILE, ORIGINAL_FILE, SAMPLE_FILE])
    assert json.loads((out / SAMPLE_FILE).read_text()) == STUDENT


def test_a_students_sample_settings_file_is_written_whole(tmp_path, monkeypatch):
    """:func:`~ditax.lora.export.write_sample`: what ``train`` writes beside a full-weight
    student's checkpoints (and ``save_lora`` beside a LoRA)."""
    from ditax.lora.export import write_sample

    (tmp_path / SAMPLE_FILE).write_bytes(OLD)
    fill_disk(monkeypatch, after=10, match=".ditax_sample.partial", code=errno.EDQUOT)
    with pytest.raises(WriteFailed) as e:
        write_sample(tmp_path, STUDENT)
    assert str(e.value) == (f"could not write {tmp_path / SAMPLE_FILE}: the disk quota is used "
                            f"up; raise the quota or free space under it "
                            f"{_kept(tmp_path / SAMPLE_FILE)}"), str(e.value)
    assert _files(tmp_path) == [SAMPLE_FILE] and (tmp_path / SAMPLE_FILE).read_bytes() == OLD
    monkeypatch.undo()
    assert write_sample(tmp_path, STUDENT) == tmp_path / SAMPLE_FILE
    assert json.loads((tmp_path / SAMPLE_FILE).read_text()) == STUDENT


# --- a run's config.yaml (ditax.train.resume.write_config)

def test_a_runs_config_yaml_on_a_full_disk_stays_as_it_was(tmp_path, monkeypatch):
    from ditax.train.resume import read_saved_config, write_config

    first = {"steps": 5, "model": {"family": "wan", "dim": 64}}
    write_config(tmp_path, first)
    before = (tmp_path / "config.yaml").read_bytes()
    fill_disk(monkeypatch, after=4, match=".config.partial")
    with pytest.raises(WriteFailed) as e:
        write_config(tmp_path, {**first, "steps": 9})
    path = tmp_path / "config.yaml"
    assert str(e.value) == f"could not write {path}: {FULL} {_kept(path)}", str(e.value)
    assert e.value.errno == errno.ENOSPC and e.value.path == path
    assert _files(tmp_path) == ["config.yaml"] and path.read_bytes() == before
    assert read_saved_config(tmp_path) == first
    monkeypatch.undo()
    assert write_config(tmp_path, {**first, "steps": 9}) == path
    assert read_saved_config(tmp_path) == {**first, "steps": 9}


# --- synthetic clip datasets (ditax.synthetic.clips)

def test_a_clip_dataset_ffmpeg_could_not_finish_leaves_no_clip(tmp_path, monkeypatch):
    """ffmpeg's ``Error writing trailer: No space left on device`` (exit status 0, as ffmpeg
    4 reports it) was a dataset reported written; now no clip and no new captions are left,
    the old captions stay. The same for one clip (:func:`write_clip`)."""
    from ditax.synthetic.clips import write_clip, write_dataset

    out = tmp_path / "clips"
    out.mkdir()
    (out / "captions.jsonl").write_bytes(OLD)
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg(tmp_path, "trailer"))
    with pytest.raises(WriteFailed) as e:
        write_dataset(out, n=3, seed=0, height=16, width=16, num_frames=2, workers=2)
    assert str(e.value) == (
        f"could not write {out / 'clip_00000.mp4'}: no space left on device (the disk is "
        f"full); ffmpeg: Error writing trailer: No space left on device; free space there or "
        f"write to another disk {NOTHING}"), str(e.value)
    assert _files(out) == ["captions.jsonl"] and (out / "captions.jsonl").read_bytes() == OLD
    (out / "one.mp4").write_bytes(OLD)
    with pytest.raises(WriteFailed, match=r"one\.mp4: no space left on device .*ffmpeg: "
                                          r"Error writing trailer"):
        write_clip(out / "one.mp4", np.zeros((2, 16, 16, 3), np.float32))
    assert _files(out) == ["captions.jsonl", "one.mp4"] and (out / "one.mp4").read_bytes() == OLD


def test_a_clip_datasets_captions_on_a_full_disk_take_the_clips_with_them(tmp_path,
                                                                         monkeypatch):
    """The clips are encoded whole (the real ffmpeg), then ``captions.jsonl`` fails: none of
    the dataset's files is left; once the disk has room every file is there, readable."""
    from ditax.synthetic.clips import generate, write_dataset
    from ditax.io.video import read_video

    out = tmp_path / "clips"
    fill_disk(monkeypatch, after=10, match=".captions.partial")
    with pytest.raises(WriteFailed) as e:
        write_dataset(out, n=3, seed=0, height=16, width=16, num_frames=2, workers=2)
    assert str(e.value) == f"could not write {out / 'captions.jsonl'}: {FULL} {NOTHING}"
    assert _files(out) == []
    monkeypatch.undo()
    write_dataset(out, n=3, seed=0, height=16, width=16, num_frames=2, workers=2)
    names = [f"clip_{i:05d}.mp4" for i in range(3)]
    assert _files(out) == ["captions.jsonl", *names]
    rows = [json.loads(r) for r in (out / "captions.jsonl").read_text().splitlines()]
    assert [r["file"] for r in rows] == names
    for name, (video, _) in zip(names, generate(3, 0, height=16, width=16, num_frames=2)):
        back = read_video(out / name).astype(np.float32) / 255
        assert np.abs(back - video).max() <= 3 / 255        # lossless 4:4:4 H.264


# --- downloads into this host's cache (ditax.io.remote)

@pytest.fixture
def store():
    """A fresh folder name in fsspec's in-process ``memory://`` store (removed after)."""
    name = f"t57w-{uuid.uuid4().hex[:8]}"
    yield name
    if MEM.exists(f"/{name}"):
        MEM.rm(f"/{name}", recursive=True)


@pytest.mark.parametrize("how", ["enospc", "efbig"])
def test_a_download_on_a_full_disk_names_the_local_file_and_keeps_the_old_one(
        tmp_path, monkeypatch, store, how):
    from ditax.io.remote.transfer import download, listing

    MEM.pipe_file(f"/{store}/a.bin", b"a" * 100)
    MEM.pipe_file(f"/{store}/sub/b.bin", b"b" * 8192)
    sizes = listing(MEM, f"/{store}")
    local = tmp_path / "mirror"
    local.mkdir()
    (local / "a.bin").write_bytes(OLD)
    if how == "enospc":
        fill_disk(monkeypatch, after=10, match=".b.partial")
        limit, words = contextlib.nullcontext(), FULL
    else:                           # the kernel's own EFBIG, past 4 KiB
        limit = file_size_limit(4096)
        words = ("a file outgrew the file-size limit (ulimit -f); raise the limit (ulimit -f "
                 "unlimited)")
    with pytest.raises(WriteFailed) as e:
        with limit:
            download(MEM, f"/{store}", sorted(sizes), sizes, local, "data.source=memory://x")
    assert str(e.value) == f"could not write {local / 'sub' / 'b.bin'}: {words} {NOTHING}"
    # renamed together: a.bin, which arrived whole, is not replaced either
    assert _files(local) == ["a.bin"] and (local / "a.bin").read_bytes() == OLD
    monkeypatch.undo()
    assert download(MEM, f"/{store}", sorted(sizes), sizes, local, "x") == 8292
    assert _files(local) == ["a.bin", "sub/b.bin"] and (local / "a.bin").read_bytes() == b"a" * 100


def test_a_failure_of_the_store_is_still_a_remote_error(tmp_path, store):
    from ditax.io.remote.transfer import download, listing
    from ditax.io.remote.urls import RemoteError

    MEM.pipe_file(f"/{store}/a.bin", b"a" * 100)
    sizes = listing(MEM, f"/{store}")
    local = tmp_path / "mirror"
    with pytest.raises(RemoteError, match=rf"^what: could not download from memory:///{store} "
                                          r"\(FileNotFoundError: "):
        download(MEM, f"/{store}", ["a.bin", "gone.bin"], {**sizes, "gone.bin": 5}, local,
                 "what")
    with pytest.raises(RemoteError, match=r"^what: memory://.*a\.bin arrived with 100 bytes, "
                                          r"not its 99; the copy was dropped"):
        download(MEM, f"/{store}", ["a.bin"], {"a.bin": 99}, local, "what")
    assert _files(local) == []


def test_a_checkpoint_step_fetched_on_a_full_disk_leaves_no_step_folder(tmp_path,
                                                                       monkeypatch, store):
    from ditax.io.remote.runs import COMMIT, StepSync

    MEM.pipe_file(f"/{store}/ck/3/state/a.bin", b"a" * 100)
    MEM.pipe_file(f"/{store}/ck/3/{COMMIT}", b"ok")
    local = tmp_path / "checkpoints"
    sync = StepSync(MEM, f"/{store}/ck", local, keep=2)
    fill_disk(monkeypatch, after=10, match=".a.partial")
    with pytest.raises(WriteFailed) as e:
        sync.fetch(3, say=lambda line: None)
    assert str(e.value) == f"could not write {local / '3'}: {FULL} {NOTHING}"
    assert list(local.iterdir()) == []
    monkeypatch.undo()
    sync.fetch(3, say=lambda line: None)
    assert _files(local) == ["3/commit_success.txt", "3/state/a.bin"]


def test_ditax_export_of_a_url_run_on_a_full_cache_disk_is_exit_1_in_one_line(
        tmp_path, monkeypatch, capsys, store):
    """The run's ``config.yaml`` is downloaded first, into this host's cache: its disk full
    is exit 1 naming the cached file (it was exit 2, a RemoteError), nothing at ``--out``."""
    from ditax.cli import main
    from ditax.io.remote.folders import staging

    monkeypatch.setenv("DITAX_REMOTE_CACHE", str(tmp_path / "cache"))
    url = f"memory://{store}/run"
    MEM.pipe_file(f"{url}/config.yaml", b"steps: 3\n")
    MEM.pipe_file(f"{url}/checkpoints/3/commit_success.txt", b"ok")
    fill_disk(monkeypatch, after=0, match=".config.partial")
    assert main(["export", url, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    cached = staging(url, "exports") / "config.yaml"
    assert err == [f"ditax export: error: could not write {cached}: {FULL} {NOTHING}"], err
    assert _files(cached.parent) == [] and not (tmp_path / "out").exists()
