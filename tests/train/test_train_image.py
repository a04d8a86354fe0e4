"""Training image-to-video configs: Wan I2V (mask + condition latents as channels, CLIP image
tokens) and Wan 2.2 TI2V (clean first frame, per-token timesteps, the first frame out of the
loss); condition data through the dataset; `ditax preprocess` of an I2V folder stores the
condition the pipeline builds."""

import json

import jax
import numpy as np
import pytest

from ditax.config import load_config
from ditax.models.base import model_family
from ditax.parallel import make_mesh
from ditax.train.batches import BatchIterator
from ditax.train.data import DataError
from ditax.train.data_writer import DatasetWriter
from ditax.train.loss import flow_loss
from ditax.train.step import Trainer

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
# tiny: 4 heads x 32 = 128 wide, 16 latent channels; I2V reads 16 + 4 + 16 channels and CLIP
# features 24 wide (257 tokens in the synthetic data)
I2V = ("model.in_channels=36", "model.image_dim=24", "model.added_kv_proj_dim=128",
       "batch_size=2")
TI2V = ("model.vae=wan2.2", "model.expand_timesteps=true", "model.in_channels=48",
        "model.out_channels=48", "data.height=64", "data.width=64", "batch_size=2")


def _losses(cfg, steps, tr=None):
    tr = tr or Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    batch = tr.put_batch(next(BatchIterator(cfg)))
    st = tr.init()
    out = []
    for _ in range(steps):
        st, m = tr.step(st, batch)
        out.append(float(m["loss"]))
    return out, st


def test_i2v_config_trains_and_a_mesh_step_equals_one_device():
    cfg = load_config("tiny", list(I2V))
    fam = model_family(cfg.model)
    assert fam.latent_channels == 16
    assert fam.condition_shapes((16, 2, 8, 8)) == {"condition": (20, 2, 8, 8),
                                                   "image": (257, 24)}
    batch = next(BatchIterator(cfg))
    assert batch["condition"].shape == (2, 20, 2, 8, 8) and batch["image"].shape == (2, 257, 24)
    one = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    losses, st = _losses(cfg, 12, one)
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses
    # one step on fsdp=2 x context=4 (Ulysses) from the same weights and batch: same loss and
    # update as on one device (the condition entries are sharded like the latents)
    init = one.init()
    params0 = jax.tree.map(np.asarray, init["params"])
    s1, m1 = one.step(init, one.put_batch(batch))
    mcfg = load_config("tiny", [*I2V, "attention.backend=ulysses"])
    many = Trainer(mcfg, make_mesh({**ONE, "fsdp": 2, "context": 4}))
    assert many.batch_sh["condition"].spec == many.batch_sh["latents"].spec
    s8, m8 = many.step(many.init(params0), many.put_batch(batch))
    assert abs(float(m8["loss"]) - float(m1["loss"])) < 1e-5
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                         s8["params"], s1["params"])
    # the updates equal within 5 % of the largest one-device update: Adam's first step moves
    # an element by lr * g / (|g| + eps), so an element whose gradient is near eps moves by
    # its sharded reduction's rounding, amplified (one host: attn2.to_out's worst element
    # 2.65e-4 on one device, 2.74e-4 on the mesh, 1.01e-5 apart, its gradient ~eps; another
    # host: < 1e-5)
    update = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))),
                          s1["params"], params0)
    assert max(jax.tree.leaves(diffs)) < 0.05 * max(jax.tree.leaves(update)), \
        (max(jax.tree.leaves(diffs)), max(jax.tree.leaves(update)))
    # the condition is used: other condition data, another loss
    other = dict(batch, condition=batch["condition"][::-1].copy(), image=batch["image"] * 0)
    s, m = one.step(one.init(params0), one.put_batch(other))
    assert abs(float(m["loss"]) - float(m1["loss"])) > 1e-4


def test_ti2v_config_trains_with_a_clean_first_frame():
    cfg = load_config("tiny", list(TI2V))
    fam = model_family(cfg.model)
    assert cfg.model.image_condition == "expand" and fam.condition_shapes((48, 2, 4, 4)) == {}
    batch = next(BatchIterator(cfg))
    assert batch["latents"].shape == (2, 48, 2, 4, 4)   # 64 px / 16 (the 2.2 VAE)
    x0 = batch["latents"]
    x_t = np.random.default_rng(0).standard_normal(x0.shape).astype(np.float32)
    x_in, t, mask = fam.training_inputs(x_t, x0, np.array([300.0, 700.0], np.float32), None)
    np.testing.assert_array_equal(np.asarray(x_in)[:, :, 0], x0[:, :, 0])
    np.testing.assert_array_equal(np.asarray(x_in)[:, :, 1], x_t[:, :, 1])
    assert t.shape == (2, 8)   # 2 frames x 2 x 2 tokens: frame 0 at t=0, frame 1 at t
    np.testing.assert_array_equal(np.asarray(t), [[0] * 4 + [300] * 4, [0] * 4 + [700] * 4])
    losses, _ = _losses(cfg, 12)
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses


def test_loss_mask_leaves_the_given_frame_out():
    """With the expand condition a wrong prediction on the first frame costs nothing."""
    cfg = load_config("tiny", list(TI2V))
    fam = model_family(cfg.model)
    x0 = np.random.default_rng(1).standard_normal((2, 48, 2, 4, 4)).astype(np.float32)
    key = jax.random.PRNGKey(0)

    def inputs(x_t, x0_, t):
        return fam.training_inputs(x_t, x0_, t, None)

    def exact(x_t, t, text, mask):   # the exact target, plus garbage on frame 0
        return noise - x0 + np.eye(1, 2, 0)[0][None, None, :, None, None] * 100.0

    k_sigma, k_noise = jax.random.split(key)
    noise = np.asarray(jax.random.normal(k_noise, x0.shape))
    loss = flow_loss(exact, x0, None, None, key, cfg.flow, inputs)
    assert float(loss) < 1e-10
    assert float(flow_loss(exact, x0, None, None, key, cfg.flow)) > 1.0  # unmasked: counted


def test_condition_round_trips_through_a_dataset(tmp_path):
    cfg = load_config("tiny", [*I2V, "data.shuffle=false"])
    rng = np.random.default_rng(2)
    w = DatasetWriter(tmp_path / "ds")
    rows = []
    for _ in range(4):
        row = dict(latents=rng.standard_normal((16, 2, 8, 8)).astype(np.float32),
                   text=rng.standard_normal((16, 64)).astype(np.float32),
                   condition=rng.standard_normal((20, 2, 8, 8)).astype(np.float32),
                   image=rng.standard_normal((17, 24)).astype(np.float32))
        rows.append(row)
        w.add(row["latents"], row["text"], None, condition=row["condition"], image=row["image"])
    w.close()
    meta = json.loads((tmp_path / "ds" / "meta.json").read_text())
    assert meta["condition"] == {"condition": [20, 2, 8, 8], "image": [17, 24]}
    it = BatchIterator(load_config("tiny", [*I2V, "data.shuffle=false",
                                            f"data.source={tmp_path / 'ds'}"]))
    b = next(it)
    for k in ("latents", "condition", "image"):
        np.testing.assert_array_equal(b[k], np.stack([rows[0][k], rows[1][k]]))
    # a text-to-video dataset for this I2V model, and the other way round: clear errors
    t2v = DatasetWriter(tmp_path / "t2v")
    t2v.add(rows[0]["latents"], rows[0]["text"])
    t2v.close()
    with pytest.raises(DataError, match=r"has no condition, image entries.*ditax preprocess"):
        BatchIterator(load_config("tiny", [*I2V, f"data.source={tmp_path / 't2v'}"]))
    with pytest.raises(DataError, match=r"stores condition, image entries, which this wan "
                       r"model does not take"):
        BatchIterator(load_config("tiny", ["batch_size=2", f"data.source={tmp_path / 'ds'}"]))
    del cfg


def test_preprocess_stores_the_condition_the_pipeline_builds(tmp_path):
    """`ditax preprocess` with a Wan 2.1 I2V folder: per clip the mask + condition latents and
    the CLIP features of the first frame — what the pipeline builds from that frame as a
    PNG-like RGB image."""
    pytest.importorskip("diffusers")
    import PIL.Image

    import ditax
    from ditax.cli import main as cli_main
    from ditax.io.video import write_mp4
    from i2v_reference import make_tiny_i2v

    _, folder = make_tiny_i2v(tmp_path / "model", "i2v")
    vids = tmp_path / "videos"
    vids.mkdir()
    rng = np.random.default_rng(3)
    video = np.clip(0.5 + 0.3 * rng.standard_normal((5, 32, 48, 3)), 0, 1)
    write_mp4(vids / "a.mp4", video, fps=8)
    (vids / "a.txt").write_text("a cat walks on the grass")
    ds = tmp_path / "ds"
    assert cli_main(["preprocess", str(vids), str(ds), "--model", str(folder), "--height", "32",
                     "--width", "48", "--frames", "5", "--text-len", "8"]) == 0
    meta = json.loads((ds / "meta.json").read_text())
    assert meta["condition"] == {"condition": [8, 2, 4, 6], "image": [17, 32]}
    from ditax.train.preprocess import read_video

    frames = read_video(vids / "a.mp4", 5, 32, 48)
    rgb = np.clip(np.round((frames[:, 0].transpose(1, 2, 0) + 1) * 127.5), 0, 255)
    pipe = ditax.load_pipeline(folder)
    cond = pipe.condition(PIL.Image.fromarray(rgb.astype(np.uint8)), None, 32, 48, 5)
    from array_record.python.array_record_module import ArrayRecordReader
    from safetensors.numpy import load

    rec = load(ArrayRecordReader(str(ds / meta["files"][0])).read([0])[0])
    np.testing.assert_allclose(rec["condition"], np.asarray(cond.channels)[0], atol=1e-5)
    np.testing.assert_allclose(rec["image"], np.asarray(cond.image)[0], atol=1e-5)


# ----------------------------------------------------------------------------------------------
# presets and `ditax plan`


@pytest.mark.parametrize("name,params_b,latent", [
    ("wan2.2-ti2v-5b", (4.9, 5.1), [48, 31, 44, 80]),        # 1280x704, 121 frames, 16x VAE
    ("wan2.1-i2v-14b-480p", (16.2, 16.6), [16, 21, 60, 104]),
    ("wan2.1-i2v-14b-720p", (16.2, 16.6), [16, 21, 90, 160]),
    ("wan2.2-i2v-a14b", (14.2, 14.4), [16, 21, 90, 160]),   # one expert; no image embedder
])
def test_image_to_video_presets_plan(name, params_b, latent):
    from ditax.plan import plan

    cfg = load_config(name)
    fam = model_family(cfg.model)
    s = cfg.sample
    assert [fam.latent_channels, *fam.latent_shape(s.num_frames, s.height, s.width)[1:]] == latent
    out = plan(cfg, make_mesh(cfg.mesh, jax.devices()[:8]))
    assert params_b[0] < out["params"] / 1e9 < params_b[1], out["params"]


@pytest.mark.parametrize("overrides", [I2V, TI2V], ids=["i2v", "ti2v"])
def test_plan_compiles_the_conditioned_forward_and_train_step(capsys, overrides):
    """The forward takes the condition as the pipeline feeds it (I2V: 36 channels and CLIP
    tokens; TI2V: per-token timesteps); the train step the dataset's entries."""
    from ditax.cli import main

    rc = main(["plan", "tiny", *overrides, "--target", "cpu:2",
               "--compile", "--train", "--json", "--latent", "2,4,4"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    res = json.loads(out)
    assert res["forward"]["latent"][1] == (16 if overrides is I2V else 48)
    assert res["forward"]["flops"] > 0 and res["train_step"]["flops"] > 0
