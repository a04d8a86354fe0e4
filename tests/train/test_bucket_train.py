"""Training on a bucketed dataset (meta.json version 2, ditax.train.bucket_data): every
global batch from one bucket, drawn by weight from the seed alone (the same for 1 process as
for 2), each bucket's records in its own per-epoch shuffle; one compiled program a shape and
nothing compiled after each shape's first step; a mixed run on fsdp2 x context4 equals one
device; resume bit for bit across a bucket change; the bucket in every metrics row; LoRA,
DMD2, FLUX.1 and image-to-video runs on buckets; bad bucket weights refused in one line.

The ``tiny`` preset with most XLA optimisations off (``fast_compile``); the runs share one
Trainer (one program a shape)."""

import json

import jax
import numpy as np
import pytest

from bucket_datasets import write_bucketed
from compiles import compiles
from ditax.config import ConfigError, load_config, validate
from ditax.parallel.mesh import make_mesh
from ditax.train.bucket_data import BLOCK, BucketDraws
from ditax.train.batches import BatchIterator
from ditax.train.data import DataSourceError
from ditax.train.loop import train
from ditax.train.step import Trainer

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
TWO = {"64x64x5": 10, "128x64x5": 6}                  # latents [16, 2, 8, 8] / [16, 2, 8, 16]
THREE = {"64x64x5": 9, "128x64x5": 5, "64x128x5": 3}
MESH = ("mesh.fsdp=2", "mesh.context=4")
STEPS = 6


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Two buckets with an empty prompt's embedding: ``(path, {bucket: latents})``."""
    return write_bucketed(tmp_path_factory.mktemp("bk") / "two", TWO, null=True)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return write_bucketed(tmp_path_factory.mktemp("bk") / "three", THREE)


def cfg_for(ds, out="unused", *extra):
    return load_config("tiny", [f"data.source={ds}", f"output_dir={out}", "batch_size=4",
                                "checkpoint.every=3", *MESH, *extra])


def which(latents, written):
    """``(bucket, record index)`` of each sample of a batch, found among the written ones."""
    out = []
    for x in latents:
        for name, lats in written.items():
            if lats.shape[1:] == x.shape:
                hit = np.flatnonzero((lats == x).all(axis=(1, 2, 3, 4)))
                if hit.size:
                    out.append((name, int(hit[0])))
    assert len(out) == len(latents)
    return out


# ----------------------------------------------------------------------------------------------
# the stream


def test_stream_is_one_bucket_a_batch_the_same_on_two_processes_and_resumable(three):
    ds, written = three
    cfg = cfg_for(ds)
    one = BatchIterator(cfg)
    parts = [BatchIterator(cfg, p, 2) for p in range(2)]
    assert one.latent_shapes == ((16, 2, 8, 8), (16, 2, 8, 16), (16, 2, 16, 8))
    assert one.latent_shape == (16, 2, 8, 8)          # the most drawn bucket's
    seen, order = {n: [] for n in THREE}, []
    for k in range(16):
        full = next(one)
        halves = [next(it) for it in parts]
        assert one.bucket == parts[0].bucket == parts[1].bucket
        for key in full:
            np.testing.assert_array_equal(full[key],
                                          np.concatenate([h[key] for h in halves]))
        records = which(full["latents"], written)
        assert {n for n, _ in records} == {one.bucket}    # one bucket a batch
        seen[one.bucket] += [i for _, i in records]
        order.append(one.bucket)
    assert set(order) == set(THREE)
    # each bucket's stream runs through all its records before repeating one (per-epoch
    # shuffle); the 3-sample bucket repeats records within a batch of 4
    for name, idx in seen.items():
        n = THREE[name]
        for e in range(len(idx) // n):
            assert sorted(idx[e * n:(e + 1) * n]) == list(range(n)), (name, idx)
    # deterministic from the seed; another seed, another order
    again = BatchIterator(cfg)
    assert [next(again) is not None and again.bucket for _ in range(16)] == order
    other = BatchIterator(cfg_for(ds, "unused", "seed=1"))
    assert [next(other) is not None and other.bucket for _ in range(16)] != order
    # the state is the batch count, the same on every process; set_state continues exactly
    st = one.get_state()
    assert st == parts[0].get_state() == parts[1].get_state() == {"next_index": 16}
    ahead = [(next(one)["latents"], one.bucket) for _ in range(5)]
    back = BatchIterator(cfg, 1, 2)
    back.set_state(st)
    for lat, name in ahead:
        np.testing.assert_array_equal(next(back)["latents"], lat[2:])
        assert back.bucket == name


def test_weights_are_honoured():
    rng = np.random.default_rng(0)
    for w in ([10, 6], [2, 1, 1], [0, 3, 1]):
        draws = BucketDraws(w, seed=int(rng.integers(1 << 31)))
        n = 3 * BLOCK + 17
        got = np.array([draws(k) for k in range(n)])
        freq = np.bincount(got[:, 0], minlength=len(w)) / n
        np.testing.assert_allclose(freq, np.array(w) / sum(w), atol=0.025)
        # j counts the earlier batches of the same bucket (across blocks)
        for b in range(len(w)):
            np.testing.assert_array_equal(got[got[:, 0] == b, 1],
                                          np.arange(np.sum(got[:, 0] == b)))
    # a fresh instance asked out of order (a resume) agrees
    late = BucketDraws([2, 1, 1], 5)
    ref = BucketDraws([2, 1, 1], 5)
    expect = [ref(k) for k in range(2 * BLOCK + 3)]
    assert late(2 * BLOCK + 2) == expect[-1] and late(7) == expect[7]


def test_configured_mix_and_bad_weights_are_one_line(three):
    ds, _ = three
    it = BatchIterator(cfg_for(ds, "unused", "data.bucket_weights=64x128x5:1,128x64x5:0"))
    assert it.latent_shape == (16, 2, 16, 8)
    assert {(next(it), it.bucket)[1] for _ in range(8)} == {"64x128x5"}
    for value, msg in [("64x64x5:-1", "weight of 64x64x5 is -1"),
                       ("64x64x5:0,128x64x5:0", "sum to 0"), ("64x64x5", "is not NAME:WEIGHT"),
                       ("64x64x5:x", "is not a number"), ("a:1,a:2", "named twice")]:
        with pytest.raises(ConfigError, match=msg) as e:
            validate(cfg_for(ds, "unused", f"data.bucket_weights={value}"))
        assert "\n" not in str(e.value) and "NAME:WEIGHT" in str(e.value)
    with pytest.raises(ConfigError, match=r"names 1x1x1, which dataset .* does not hold; its "
                                          r"buckets are 64x64x5, 128x64x5, 64x128x5"):
        BatchIterator(cfg_for(ds, "unused", "data.bucket_weights=1x1x1:1"))
    with pytest.raises(ConfigError, match="the synthetic source holds one shape; remove"):
        BatchIterator(load_config("tiny", ["data.bucket_weights=64x64x5:1"]))


# ----------------------------------------------------------------------------------------------
# training runs


@pytest.fixture(scope="module")
def trainer(two):
    cfg = cfg_for(two[0])
    return Trainer(cfg, make_mesh(cfg.mesh))


@pytest.fixture(scope="module")
def full_run(two, trainer, tmp_path_factory):
    """``STEPS`` steps on fsdp2 x context4 with the programs compiled per step recorded:
    ``(result, output dir, compiled names per step, lines said)``; one checkpoint, after the
    last step (a first save compiles its own small programs)."""
    out = tmp_path_factory.mktemp("runs") / "a"
    marks, said = [], []
    with compiles() as log:
        r = train(cfg_for(two[0], out, f"steps={STEPS}", "checkpoint.every=100"),
                  trainer=trainer, progress=False, say=said.append,
                  on_step=lambda step, row: marks.append(len(log.names)))
    per_step = [log.names[a:b] for a, b in zip([0] + marks, marks)]
    return r, out, per_step, said


def test_nothing_compiles_after_the_first_step_of_each_shape(full_run):
    r, _, per_step, _ = full_run
    assert set(r.buckets) == set(TWO)           # both shapes trained
    for i, names in enumerate(per_step):
        first = r.buckets[i] not in r.buckets[:i]
        assert names.count("jit(_step_fn)") == (1 if first else 0), (i, names)
        if not first:
            assert names == [], (i, r.buckets, names)


def test_metrics_name_the_bucket_and_the_summary_gives_each_loss(full_run):
    r, out, _, said = full_run
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [row["bucket"] for row in rows] == r.buckets
    assert [row["loss"] for row in rows] == r.losses
    first = {b: r.buckets.index(b) for b in TWO}
    assert [i for i, row in enumerate(rows) if row.get("includes_compile")] == sorted(
        first.values())
    tokens = {row["bucket"]: row["tokens_per_s"] * row["step_time"] / 4 for row in rows}
    assert tokens == pytest.approx({"64x64x5": 32, "128x64x5": 64})
    assert ("bucketed dataset, each batch from one bucket: 64x64x5 (10 samples, 62% of "
            "batches), 128x64x5 (6 samples, 38% of batches)") in said
    mean = {b: np.mean([x for x, y in zip(r.losses, r.buckets) if y == b]) for b in TWO}
    assert (f"loss per bucket (mean of each one's last 10 steps): 64x64x5 {mean['64x64x5']:.4f} "
            f"(4 steps), 128x64x5 {mean['128x64x5']:.4f} (2 steps)") in said
    events = b"".join(f.read_bytes() for f in (out / "tb").glob("events.out.tfevents.*"))
    assert all(f"train/loss_by_bucket/{b}".encode() in events for b in TWO)


def test_mixed_run_on_fsdp2_context4_equals_one_device(two, full_run, trainer):
    r, _, _, _ = full_run
    cfg = load_config("tiny", [f"data.source={two[0]}", "batch_size=4"])
    one = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    state = one.init(jax.tree.map(np.asarray, trainer.init()["params"]))
    data, losses = BatchIterator(cfg), []
    for _ in range(STEPS):
        state, m = one.step(state, one.put_batch(next(data)))
        losses.append(float(m["loss"]))
    np.testing.assert_allclose(losses, r.losses, atol=1e-5, rtol=0)
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                         state["params"], r.state["params"])
    assert max(jax.tree.leaves(diffs)) < 1e-5


def test_resume_mid_epoch_is_bit_exact_across_a_bucket_change(two, full_run, trainer,
                                                              tmp_path):
    r, _, _, _ = full_run
    half = STEPS // 2
    assert r.buckets[half - 1] != r.buckets[half]          # the resume changes bucket
    b1 = train(cfg_for(two[0], tmp_path, f"steps={half}"), trainer=trainer, progress=False)
    b2 = train(cfg_for(two[0], tmp_path, f"steps={STEPS}"), trainer=trainer, progress=False)
    assert b2.resumed_from == half
    assert b1.losses + b2.losses == r.losses and b1.buckets + b2.buckets == r.buckets
    for x, y in zip(jax.tree.leaves(r.state), jax.tree.leaves(b2.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ----------------------------------------------------------------------------------------------
# other run kinds and families on buckets (a step of each shape)


def test_flux_lora_run_on_image_buckets(tmp_path):
    """FLUX.1 (image buckets of two aspect ratios, frame 1; its shift from each one's token
    count) trains LoRA adapters on both."""
    ds, _ = write_bucketed(tmp_path / "ds", {"64x64x1": 5, "128x64x1": 3}, text_shape=(8, 32),
                           shapes={"64x64x1": (16, 1, 8, 8), "128x64x1": (16, 1, 8, 16)},
                           condition=lambda shape: {"pooled": (32,)})
    cfg = load_config("flux-tiny", [f"data.source={ds}", f"output_dir={tmp_path / 'run'}",
                                    "batch_size=2", "steps=2", "lora.rank=4", *MESH])
    r = train(cfg, mesh=make_mesh(ONE, jax.devices()[:1]), progress=False)
    assert r.buckets == ["64x64x1", "128x64x1"] and np.all(np.isfinite(r.losses))
    assert (tmp_path / "run" / "lora.safetensors").is_file()


def test_distill_run_on_buckets(two, tmp_path):
    """A DMD2 step on a bucketed dataset (its schedule and critic shift come from the batch's
    shape, as the plain step's flow does); the student's sample settings at the most drawn
    bucket's shape. One step: each further shape is one more compile of the same program."""
    r = train(cfg_for(two[0], tmp_path, "steps=1", "distill.method=dmd2",
                      "distill.critic_updates=1", "distill.steps=2", "distill.guidance=2",
                      "distill.backward_simulation=false"),
              mesh=make_mesh(ONE, jax.devices()[:1]), progress=False)
    assert r.buckets == ["64x64x5"] and np.all(np.isfinite(r.losses))
    sample = json.loads((tmp_path / "ditax_sample.json").read_text())
    assert sample["num_inference_steps"] == 2 and sample["guidance_scale"] == 1.0


def test_image_to_video_condition_per_bucket_and_refusals_name_the_bucket(tmp_path):
    """Wan I2V: each bucket stores its condition entries (mask + latents on its grid, CLIP
    features) and the batches carry them; a bucket that does not fit the model is refused in
    the dataset's words, naming the bucket."""
    i2v = ["model.in_channels=36", "model.image_dim=24", "model.added_kv_proj_dim=128",
           "batch_size=2"]
    cond = {"64x64x5": {"condition": (20, 2, 8, 8), "image": (257, 24)},
            "128x64x5": {"condition": (20, 2, 8, 16), "image": (257, 24)}}
    ds, _ = write_bucketed(tmp_path / "ok", {"64x64x5": 2, "128x64x5": 2},
                           condition=lambda shape: cond["64x64x5" if shape[-1] == 8
                                                        else "128x64x5"])
    it = BatchIterator(load_config("tiny", [*i2v, f"data.source={ds}"]))
    for _ in range(4):
        batch = next(it)
        assert batch["condition"].shape == (2, *cond[it.bucket]["condition"])
        assert batch["image"].shape == (2, 257, 24)
    bad, _ = write_bucketed(tmp_path / "bad", {"64x64x5": 2, "128x64x5": 2},
                            condition=lambda shape: {"condition": (20, 2, 8, 8),
                                                     "image": (257, 24)})
    with pytest.raises(DataSourceError, match=r"\(bucket 128x64x5\): condition shape "
                                              r"\[20, 2, 8, 8\] != the model's \[20, 2, 8, 16\]"):
        BatchIterator(load_config("tiny", [*i2v, f"data.source={bad}"]))
    with pytest.raises(DataSourceError, match=r"\(bucket 64x64x5\) has no condition, image "
                                              r"entries"):
        BatchIterator(load_config("tiny", [*i2v, f"data.source={tmp_path / 'plain'}"])
                      if write_bucketed(tmp_path / "plain", {"64x64x5": 1}) else None)
    wide, _ = write_bucketed(tmp_path / "wide", {"64x64x5": 1}, shapes={"64x64x5": (4, 2, 8, 8)})
    with pytest.raises(DataSourceError, match=r"\(bucket 64x64x5\): latents have 4 channels but "
                                              r"the wan model takes 16"):
        BatchIterator(load_config("tiny", [f"data.source={wide}"]))
