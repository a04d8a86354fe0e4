"""Real data path end to end: mp4 videos + captions → `ditax preprocess` (the pipeline's VAE and
UMT5) → ArrayRecord dataset → `ditax train` initialised from the pipeline's transformer."""

import json

import numpy as np
import pytest

from ditax.cli import main as cli_main
from ditax.config import ConfigError, load_config
from ditax.demo.folders import TRANSFORMER
from random_pipeline import random_pipeline_folder

pytestmark = pytest.mark.usefixtures("fast_compile")

MODEL = [f"model.{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
         for k, v in TRANSFORMER.items()
         if k in ("patch_size", "num_attention_heads", "attention_head_dim", "in_channels",
                  "out_channels", "text_dim", "freq_dim", "ffn_dim", "num_layers")]


def _write_video(path, rng, frames=9, size=32):
    from ditax.io.video import write_mp4

    xx = np.mgrid[0:size, 0:size][1]
    phase = rng.uniform(0, 6.28)
    video = np.stack([np.stack([0.5 + 0.4 * np.sin(xx / 5 + f / 3 + phase + c) for c in range(3)],
                               -1) for f in range(frames)])
    write_mp4(path, video, fps=8)


@pytest.fixture(scope="module")
def pipe_dir(tmp_path_factory):
    return random_pipeline_folder(tmp_path_factory.mktemp("e2e") / "pipeline")


@pytest.fixture(scope="module")
def clips(tmp_path_factory, pipe_dir):
    """Three captioned 9-frame clips and the dataset `ditax preprocess` (one clip per encoder
    call) writes from their first 5 frames: (videos folder, dataset folder). One preprocess
    for the tests below."""
    tmp = tmp_path_factory.mktemp("e2e_clips")
    rng = np.random.default_rng(0)
    vids = tmp / "videos"
    vids.mkdir()
    for i, cap in enumerate(["a cat walks on the grass", "waves crash on the rocks",
                             "a red car drives through the rain"]):
        _write_video(vids / f"clip{i}.mp4", rng)
        (vids / f"clip{i}.txt").write_text(cap)
    ds = tmp / "dataset"
    rc = cli_main(["preprocess", str(vids), str(ds), "--model", str(pipe_dir), "--height", "32",
                   "--width", "32", "--frames", "5", "--text-len", "8"])
    assert rc == 0
    return vids, ds


def test_preprocess_then_train_from_pipeline(tmp_path, clips, pipe_dir, capsys):
    vids, ds = clips
    meta = json.loads((ds / "meta.json").read_text())
    assert meta["num_samples"] == 3
    assert tuple(meta["latent_shape"]) == (16, 2, 4, 4)      # 5 frames → 2 latent, 32/8 = 4
    assert tuple(meta["text_shape"]) == (8, TRANSFORMER["text_dim"])

    out = tmp_path / "run"
    args = ["train", "tiny", *MODEL, f"init_from={pipe_dir}", f"data.source={ds}",
            "data.text_len=8", "steps=2", "batch_size=2", "mesh.fsdp=2", "mesh.context=4",
            f"output_dir={out}", "checkpoint.every=1", "--no-progress"]
    assert cli_main(args) == 0
    log = capsys.readouterr()
    assert "initialised weights from" in log.out + log.err
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert all(np.isfinite(x["loss"]) and x["loss"] > 0 for x in lines)


def test_init_from_architecture_mismatch_is_reported(tmp_path, pipe_dir):
    from ditax.train.loop import train

    cfg = load_config("tiny", [f"init_from={pipe_dir}", f"output_dir={tmp_path / 'r'}",
                               "steps=1", "model.freq_dim=32"])
    with pytest.raises(ConfigError, match=r"freq_dim: config 32 vs folder 64.*pass "
                                          r"model\.freq_dim=64"):
        train(cfg, progress=False)


def test_preprocess_in_groups_writes_the_same_dataset(tmp_path, clips, pipe_dir):
    """``batch=2`` over 3 clips (a group of 2, then 1) writes the samples ``batch=1`` (the
    module's dataset) writes, in the same order; ``batch=0`` is refused naming the value."""
    import grain

    from ditax.train.data import _decode, read_meta
    from ditax.train.preprocess import preprocess

    vids, ds1 = clips
    kw = dict(height=32, width=32, frames=5, text_len=8, say=lambda _: None)
    samples = {}
    for b in (1, 2):
        out = ds1 if b == 1 else preprocess(vids, tmp_path / f"ds{b}", pipe_dir, batch=b, **kw)
        files = [str(out / f) for f in read_meta(out)["files"]]
        src = grain.sources.ArrayRecordDataSource(files)
        samples[b] = [_decode(src[i]) for i in range(len(src))]
    assert len(samples[1]) == len(samples[2]) == 3
    for one, grouped in zip(samples[1], samples[2]):
        assert one.keys() == grouped.keys()
        np.testing.assert_array_equal(one["text_mask"], grouped["text_mask"])
        for k in ("latents", "text"):
            np.testing.assert_allclose(grouped[k], one[k], rtol=1e-5, atol=1e-5)
    assert not np.allclose(samples[1][0]["latents"], samples[1][1]["latents"])
    with pytest.raises(ValueError, match="batch=0"):
        preprocess(vids, tmp_path / "ds0", pipe_dir, batch=0, **kw)
