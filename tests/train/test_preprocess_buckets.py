"""``ditax preprocess --buckets`` / ``--bucket-area`` (issue 44 parts 1 and 5): mixed material
(landscape and portrait clips, stills, clips of different lengths) in one dataset of several
shapes, ``meta.json`` version 2. Each clip goes to the bucket nearest its aspect ratio with the
longest frame count it has, covered and center-cropped; a clip that fits no bucket is skipped
with a line before any encoding; every wrong flag is one line, exit 2, before any model loads;
bad files are named in one pre-pass."""

import json

import grain
import numpy as np
import PIL.Image
import pytest

from ditax.cli import main
from ditax.demo import flux_model_path, model_path
from ditax.train.buckets import Bucket, assign, derive_buckets, pixel_step

def _bands(h: int, w: int) -> np.ndarray:
    """``[h, w, 3]`` in [0, 1]: red, green and blue vertical thirds."""
    x = np.zeros((h, w, 3))
    x[:, : w // 3], x[:, w // 3: 2 * w // 3], x[:, 2 * w // 3:] = (1, 0, 0), (0, 1, 0), (0, 0, 1)
    return x


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A folder of mixed material: a landscape clip of 9 frames, a landscape clip of 6, a
    portrait clip of 5, a portrait clip of 3 (too short), a wide still of bands."""
    from ditax.io.video import write_mp4

    v = tmp_path_factory.mktemp("mixed")
    r = np.random.default_rng(0)
    write_mp4(v / "land.mp4", r.uniform(0, 1, (9, 32, 48, 3)), fps=8)
    write_mp4(v / "land6.mp4", r.uniform(0, 1, (6, 34, 50, 3)), fps=8)
    write_mp4(v / "port.mp4", r.uniform(0, 1, (5, 48, 32, 3)), fps=8)
    write_mp4(v / "short.mp4", r.uniform(0, 1, (3, 48, 32, 3)), fps=8)
    PIL.Image.fromarray((_bands(32, 96) * 255).astype(np.uint8)).save(v / "wide.png")
    for name in ("land", "land6", "port", "short", "wide"):
        (v / f"{name}.txt").write_text(f"a {name} clip")
    return v


def _run(v, out, *extra):
    return main(["preprocess", str(v), str(out), "--model", "demo", "--text-len", "8",
                 "--no-progress", *extra])


# ---------------------------------------------------------------------------------------------
# the bucket set and the assignment


def test_the_pixel_step_is_the_familys_grid_times_the_patch():
    assert pixel_step("wan", None) == 16                        # Wan 2.1: 8x VAE, 2x2 patch
    assert pixel_step("wan", model_path()) == 16                # the demo's 4x VAE, 4x4 patch
    assert pixel_step("flux", None) == 16                       # FLUX.1: 8x VAE, 2x2 packing
    assert pixel_step("flux", flux_model_path()) == 8           # the small Flux's 4x VAE


def test_derived_buckets_follow_the_documented_rule():
    small = derive_buckets(48 * 32, [5, 1], "wan", None)
    assert [b.name for b in small.buckets] == ["32x48x5", "32x48x1", "32x32x5", "32x32x1",
                                               "48x32x5", "48x32x1"]
    assert small.policy["kind"] == "area" and small.policy["step"] == 16
    wan = derive_buckets(832 * 480, [81, 49, 17], "wan", None)
    sizes = list(dict.fromkeys(b.size for b in wan.buckets))
    assert (832, 480) in sizes and (480, 832) in sizes and (624, 624) in sizes
    for w, h in sizes:
        assert w % 16 == h % 16 == 0 and w * h <= 832 * 480 and 0.5 <= w / h <= 2
        assert w * (h + 16) > 832 * 480 or (w, h) == (624, 624)      # the tallest that fits
    assert [w / h for w, h in sizes] == sorted(w / h for w, h in sizes)
    assert len(wan.buckets) == 3 * len(sizes) and wan.buckets[0].frames == 81


def test_a_clip_goes_to_its_nearest_aspect_then_its_longest_frames():
    bs = [Bucket(832, 480, 81), Bucket(832, 480, 49), Bucket(480, 832, 49),
          Bucket(624, 624, 1)]
    assert assign((1920, 1080), 100, bs)[0] == Bucket(832, 480, 81)
    assert assign((1920, 1080), 60, bs)[0] == Bucket(832, 480, 49)
    assert assign((1080, 1920), 60, bs)[0] == Bucket(480, 832, 49)
    assert assign((1000, 1000), 1, bs)[0] == Bucket(624, 624, 1)
    b, why = assign((1920, 1080), 30, bs)          # never the portrait bucket: skipped
    assert b is None and why.startswith("30 frames, fewer than the 49 of the shortest of the "
                                        "buckets of size 832x480")
    b, why = assign((1920, 1080), 1, bs)
    assert b is None and "a still image (1 frame)" in why and "832x480x1" in why
    # a tie goes to the bucket listed first
    assert assign((100, 100), 5, [Bucket(64, 32, 5), Bucket(32, 64, 5)])[0].name == "64x32x5"


# ---------------------------------------------------------------------------------------------
# wrong flags: one line, exit 2, before any model loads

BAD = [
    (["--buckets", "832x480"], "--buckets '832x480': not WIDTHxHEIGHTxFRAMES"),
    (["--buckets", "0x480x81"], "--buckets 0x480x81: width, height and frames must be at "
                                "least 1"),
    (["--buckets", "833x480x81"], "--buckets 833x480x81 is not on the Wan latent grid: width "
                                  "and height must be multiples of 16 (the VAE's 4x and the "
                                  "transformer's 4x4 patch)"),
    (["--buckets", "72x64x17"], "the nearest valid bucket is 64x64x17"),     # issue 57
    (["--buckets", "833x480x81"], "the nearest valid bucket is 832x480x81"),
    (["--buckets", "832x480x80"], "80 frames: the Wan VAE takes 4k+1 frames; the nearest "
                                  "valid bucket is 832x480x81"),
    (["--buckets", "48x32x5,48x32x5"], "--buckets 48x32x5 is named twice"),
    (["--buckets", "48x32x5,"], "--buckets '': not WIDTHxHEIGHTxFRAMES"),
    (["--buckets", "48x32x5", "--bucket-area", "1536"], "--buckets and --bucket-area: give one"),
    (["--buckets", "48x32x5", "--height", "32"], "--height 32 with --buckets"),
    (["--buckets", "48x32x5", "--frames", "5"], "--frames 5 with --buckets"),
    (["--buckets", "48x32x5", "--resize", "stretch"], "never stretches; drop --resize"),
    (["--bucket-area", "0"], "--bucket-area 0: must be an integer from 1"),
    (["--bucket-area", "50"], "--bucket-area 50: holds no bucket; the smallest is 16x16"),
    (["--bucket-area", "1536", "--frames", "5,6"], "--frames 6: 6 frames: the Wan VAE takes "
                                                   "4k+1 frames; the nearest valid count is 5"),
    (["--bucket-area", "1536", "--frames", "5,a"], "--frames 'a': not a positive integer"),
    (["--bucket-area", "1536", "--frames", "5,5"], "--frames 5 is given twice"),
    (["--bucket-area", "1536", "--width", "32"], "--width 32 with --bucket-area"),
    (["--frames", "5,9"], "--frames 5,9: a list of frame counts is for --bucket-area"),
    (["--num-processes", "0", "--process-id", "0"], "--num-processes=0: must be from 1"),
    (["--num-processes", "2", "--process-id", "2"], "--process-id=2: must be from 0 to 1"),
    (["--num-processes", "2"], "--num-processes needs --process-id K too"),
    (["--process-id", "1"], "--process-id needs --num-processes N too"),
    (["--buckets", "4800x3200x5", "--batch", "64"], "bucket 4800x3200x5: --frames x --height "
                                                    "x --width x --batch"),
]


def test_wrong_flags_are_one_line_before_any_model_loads(clips, tmp_path, capsys, monkeypatch):
    import ditax.train.preprocess as pre

    def no_model(*a, **k):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(pre, "_encoders", no_model)
    flux = ["--model", "flux-demo"]
    for args, words in BAD + [(flux + ["--buckets", "64x64x5"],
                               "--buckets 64x64x5 is not on the Flux latent grid: 5 frames: "
                               "Flux makes still images; the nearest valid bucket is 64x64x1")]:
        assert _run(clips, tmp_path / "out", *args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (args, err)
        assert not (tmp_path / "out").exists(), args


# ---------------------------------------------------------------------------------------------
# bad data: named in one pre-pass; no clip fitting any bucket


def test_bad_files_are_listed_in_one_pre_pass(clips, tmp_path, capsys, monkeypatch):
    import shutil

    import ditax.train.preprocess as pre

    monkeypatch.setattr(pre, "_encoders", lambda *a: pytest.fail("a model loaded"))
    v = tmp_path / "v"
    shutil.copytree(clips, v)
    (v / "broken.mp4").write_bytes(b"\x00not a video" * 50)
    (v / "broken.txt").write_text("x")
    (v / "nocap.mp4").write_bytes((v / "land.mp4").read_bytes())
    PIL.Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(v / "dot.png")
    (v / "dot.txt").write_text("x")
    assert _run(v, tmp_path / "out", "--buckets", "48x32x5,32x48x5,32x32x1") == 2
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert len(err) == 1, err
    for words in ("3 problem(s) before any encoding", "broken.mp4: cannot be read as a video",
                  "no caption for ['nocap.mp4']",
                  "dot.png is 2x2 (WxH), more than 4x smaller than its bucket 32x32x1"):
        assert words in err[0], (words, err[0])
    assert not (tmp_path / "out").exists()
    # no clip fits any bucket: exit 2, each named with its frame count
    assert _run(clips, tmp_path / "out", "--buckets", "48x32x13,32x48x13") == 2
    out, err = capsys.readouterr()
    assert "skip land.mp4: 9 frames, fewer than the 13" in out, out
    assert ("no clip fits any bucket (5 skipped: land.mp4: 9 frames, fewer than the 13 of the "
            "shortest of the buckets of size 48x32") in err, err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# a bucketed dataset


def test_mixed_material_makes_one_dataset_of_several_shapes(clips, tmp_path, capsys):
    from ditax.train.data import _decode, dataset_buckets, read_meta

    out = tmp_path / "ds"
    assert _run(clips, out, "--buckets", "48x32x9,48x32x5,32x48x5,48x32x1", "--batch",
                "2") == 0
    said = capsys.readouterr().out.splitlines()
    # the skip line comes before any encoding, the closing line counts per bucket
    assert said[0] == ("skip short.mp4: 3 frames, fewer than the 5 of the shortest of the "
                       "buckets of size 32x48, the nearest to its 32x48; add a shorter bucket "
                       "to keep it"), said
    assert said[-2] == ("4 samples in 4 bucket(s): 48x32x9 1, 48x32x5 1, 32x48x5 1, 48x32x1 1; "
                        "1 clip(s) skipped (fit no bucket); resize=crop (center, cover), never "
                        "stretched"), said
    assert said[1] == ("4 clip(s) to encode: 48x32x9 1, 48x32x5 1, 32x48x5 1, 48x32x1 1; "
                       "1 skipped"), said
    assert said[2] == "[1/4] land.mp4 -> 48x32x9: latents (16, 3, 8, 12)", said
    meta = read_meta(out)
    assert meta["version"] == 2 and meta["num_samples"] == 4 and meta["num_processes"] == 1
    assert meta["text_shape"] == [8, 64] and meta["null_text"] == "null_text.safetensors"
    assert meta["resize"] == "crop" and meta["model"] == str(model_path())
    assert meta["skipped"] == [{"file": "short.mp4", "why": said[0].split(": ", 1)[1]}]
    pol = meta["bucket_policy"]
    assert pol["kind"] == "given" and pol["step"] == 16 and pol["buckets"] == [
        "48x32x9", "48x32x5", "32x48x5", "48x32x1"]
    assert {"assign", "resize", "frame_count"} <= set(pol)
    buckets = dataset_buckets(meta)
    assert [(b["name"], b["width"], b["height"], b["frames"], b["latent_shape"],
             b["num_samples"], b["files"]) for b in buckets] == [
        ("48x32x9", 48, 32, 9, [16, 3, 8, 12], 1, ["48x32x9/data-00000.array_record"]),
        ("48x32x5", 48, 32, 5, [16, 2, 8, 12], 1, ["48x32x5/data-00000.array_record"]),
        ("32x48x5", 32, 48, 5, [16, 2, 12, 8], 1, ["32x48x5/data-00000.array_record"]),
        ("48x32x1", 48, 32, 1, [16, 1, 8, 12], 1, ["48x32x1/data-00000.array_record"])]
    assert meta["files"] == [f for b in buckets for f in b["files"]]
    recs = [_decode(grain.sources.ArrayRecordDataSource([str(out / b["files"][0])])[0])
            for b in buckets]
    for b, rec in zip(buckets, recs):
        assert list(rec["latents"].shape) == b["latent_shape"] and rec["text"].shape == (8, 64)
    # the 3:1 still was cropped to 3:2 (its center kept), not stretched
    import PIL.ImageOps

    from ditax.models.wan.family import WanFamily

    with PIL.Image.open(clips / "wide.png") as im:
        fit = PIL.ImageOps.fit(im.convert("RGB"), (48, 32), PIL.Image.Resampling.BICUBIC)
        squeezed = im.convert("RGB").resize((48, 32), PIL.Image.Resampling.BICUBIC)
    pair = np.stack([np.asarray(x, np.float32) / 127.5 - 1 for x in (fit, squeezed)])
    enc = WanFamily.load_encoders(model_path())
    crop, stretch = np.asarray(enc.encode_video(pair.transpose(0, 3, 1, 2)[:, :, None]))
    np.testing.assert_allclose(recs[3]["latents"], crop, atol=1e-5)
    assert np.abs(recs[3]["latents"] - stretch).max() > 0.1


def test_bucket_area_derives_frame_1_buckets_only_when_asked(clips, tmp_path, capsys):
    from ditax.train.data import dataset_buckets, read_meta

    out = tmp_path / "area"
    assert _run(clips, out, "--bucket-area", "1536", "--frames", "5") == 0
    said = capsys.readouterr().out
    meta = read_meta(out)
    assert meta["bucket_policy"]["kind"] == "area" and meta["bucket_policy"]["area"] == 1536
    # the demo's 4x VAE and 4x4 patch: sides multiples of 16
    assert meta["bucket_policy"]["buckets"] == ["32x48x5", "32x32x5", "48x32x5"]
    assert {b["name"]: b["num_samples"] for b in dataset_buckets(meta)} == {
        "32x48x5": 1, "48x32x5": 2}
    # the still (no frame-1 bucket without 1 in --frames) and the short clip are skipped
    assert [s["file"] for s in meta["skipped"]] == ["short.mp4", "wide.png"]
    assert "skip wide.png: a still image (1 frame) and no frame-1 bucket among the buckets " \
           "of size 48x32" in said and "add 48x32x1 to --buckets (or 1 to --frames)" in said


# ---------------------------------------------------------------------------------------------
# reading meta.json version 2


def test_read_meta_checks_version_2_and_dataset_buckets_reads_both(tmp_path):
    from ditax.train.bucket_writer import BucketWriter
    from ditax.train.data import DataSourceError, dataset_buckets, read_meta
    from ditax.train.data_writer import DatasetWriter

    r = np.random.default_rng(0)
    w = BucketWriter(tmp_path / "v2", ["64x32x5", "32x64x5"], samples_per_file=2)
    for b, n, lat in ((Bucket(64, 32, 5), 3, (16, 2, 4, 8)), (Bucket(32, 64, 5), 1,
                                                                (16, 2, 8, 4))):
        for _ in range(n):
            w.add(b, r.standard_normal(lat), r.standard_normal((8, 64)), np.ones(8, np.uint8))
    w.close({"resize": "crop"})
    meta = read_meta(tmp_path / "v2")
    assert [(b["name"], b["num_samples"], len(b["files"]), b["condition"])
            for b in dataset_buckets(meta)] == [("64x32x5", 3, 2, {}), ("32x64x5", 1, 1, {})]
    bad = [("buckets", lambda m: m["buckets"].append(m["buckets"][0]), "listed twice"),
           ("count", lambda m: m.update(num_samples=5), "the buckets hold 4 samples"),
           ("shape", lambda m: m["buckets"][0].update(latent_shape=[16, 2]), "bucket 0 lacks"),
           ("files", lambda m: m["buckets"][1].update(files=["x.array_record"]), "missing"),
           ("version", lambda m: m.update(version=3), "is not 'ditax-latents' v1 or v2")]
    for name, spoil, words in bad:
        m = json.loads((tmp_path / "v2" / "meta.json").read_text())
        spoil(m)
        d = tmp_path / name
        d.mkdir()
        for f in ("64x32x5", "32x64x5"):
            (d / f).symlink_to(tmp_path / "v2" / f)
        (d / "meta.json").write_text(json.dumps(m))
        with pytest.raises(DataSourceError, match=words):
            read_meta(d)
    # version 1: one bucket, named from its sizes (or "default")
    v1 = DatasetWriter(tmp_path / "v1")
    v1.add(r.standard_normal((16, 2, 4, 8)), r.standard_normal((8, 64)))
    v1.close({"height": 32, "width": 64, "frames": 5})
    (one,) = dataset_buckets(read_meta(tmp_path / "v1"))
    assert (one["name"], one["width"], one["frames"], one["latent_shape"], one["files"]) == (
        "64x32x5", 64, 5, [16, 2, 4, 8], ["data-00000.array_record"])
    assert dataset_buckets({**read_meta(tmp_path / "v1"), "width": None})[0]["name"] == "default"
