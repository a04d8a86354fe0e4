"""Training a VACE model (``model.vace_layers``) on what `ditax preprocess` stores for a tiny
random diffusers ``WanVACEPipeline`` folder: per clip the control context the pipeline builds
from the clip's sidecars (control video, mask video, a reference image), the reference's
latent frame before the clip's; the flow loss of a training step on that dataset equals the
same loss computed with the folder's diffusers ``WanVACETransformer3DModel`` (same weights,
noise and timesteps); by default only the VACE branch trains (the base frozen: no optimiser
state, not changed); a step on fsdp 2 x context 4 (Ulysses) equals one device; datasets and
sidecars that do not fit are refused in one line."""

import json

import jax
import numpy as np
import pytest

from ditax.config import load_config
from ditax.errors import ConfigError, RequestError
from ditax.parallel import make_mesh
from ditax.train.batches import BatchIterator
from ditax.train.data import DataError
from ditax.train.data_writer import DatasetWriter
from ditax.train.step import Trainer

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
# the folder's transformer: 4 heads x 8, 3 blocks, hints after blocks 2 and 0 (unsorted, as a
# config may list them), 2 x 4 + 64 control channels; clips 32 x 48 px, 5 frames + a reference:
# latents [4, 3, 4, 6]
ARCH = dict(num_layers=3, vace_layers=[2, 0])
VACE = ["model.num_attention_heads=4", "model.attention_head_dim=8", "model.in_channels=4",
        "model.out_channels=4", "model.text_dim=32", "model.freq_dim=32", "model.ffn_dim=48",
        "model.num_layers=3", "model.vace_layers=2,0", "model.vace_in_channels=72",
        "data.text_len=8", "data.shuffle=false", "batch_size=2"]
SIZE = ["--height", "32", "--width", "48", "--frames", "5", "--text-len", "8"]


def _diff(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(
        lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b)), default=0.0)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The folder, two captioned clips with sidecars (a: control + mask + reference; b: mask
    + reference, so its control is the clip itself) and `ditax preprocess`'s dataset."""
    import PIL.Image

    from ditax.cli import main as cli_main
    from ditax.io.video import write_mp4
    from vace_reference import PIPELINE_ARCH, make_tiny_vace

    tmp = tmp_path_factory.mktemp("vace_train")
    pipe, folder = make_tiny_vace(tmp, two_experts=False, arch={**PIPELINE_ARCH, **ARCH})
    vids = tmp / "videos"
    vids.mkdir()
    rng = np.random.default_rng(3)
    keep = np.repeat(np.array([0, 0, 1, 1, 1.0])[:, None, None, None], 32, 1)
    for name in ("a", "b"):
        write_mp4(vids / f"{name}.mp4", np.clip(0.5 + 0.3 * rng.standard_normal((5, 32, 48, 3)),
                                                0, 1))
        write_mp4(vids / f"{name}.mask.mp4", keep.repeat(48, 2).repeat(3, 3))
        PIL.Image.fromarray(rng.integers(0, 256, (20, 40, 3), dtype=np.uint8)).save(
            vids / f"{name}.ref.png")
        (vids / f"{name}.txt").write_text(f"a cat walks on the grass, take {name}")
    write_mp4(vids / "a.control.mp4", np.clip(0.5 + 0.2 * rng.standard_normal((5, 32, 48, 3)),
                                              0, 1))
    ds = tmp / "ds"
    assert cli_main(["preprocess", str(vids), str(ds), "--model", str(folder), *SIZE]) == 0
    return pipe, folder, vids, ds


@pytest.fixture(scope="module")
def one(dataset):
    """One device on the dataset: the trainer, its batch (text mask all ones: diffusers takes
    none; the embeddings are zero past each prompt either way), the folder's weights and one
    step's state and metrics."""
    _, folder, _, ds = dataset
    cfg = load_config(None, [*VACE, f"data.source={ds}"])
    tr = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    batch = next(BatchIterator(cfg))
    batch = dict(batch, text_mask=np.ones_like(batch["text_mask"]))
    weights = jax.tree.map(np.asarray, tr.family.load_params(
        tr.family.weights_folder(folder), tr.mesh))
    st = tr.init(weights)
    before = {k: jax.tree.map(np.asarray, st[k]) for k in ("params", "frozen", "key")}
    after, metrics = tr.step(st, tr.put_batch(batch))
    return tr, batch, weights, before, after, metrics


def test_preprocess_stores_the_context_the_pipeline_builds(dataset, tmp_path):
    import ditax
    from ditax.train.preprocess import find_samples, read_sidecars, read_video

    _, folder, vids, ds = dataset
    meta = json.loads((ds / "meta.json").read_text())
    assert meta["num_samples"] == 2       # the sidecars are no samples
    assert meta["condition"] == {"control": [72, 3, 4, 6]} and meta["latent_shape"] == [4, 3, 4, 6]
    from array_record.python.array_record_module import ArrayRecordReader
    from safetensors.numpy import load

    rec = load(ArrayRecordReader(str(ds / meta["files"][0])).read([0])[0])   # clip a
    control = read_video(vids / "a.control.mp4", 5, 32, 48).transpose(1, 2, 3, 0)
    mask = (read_video(vids / "a.mask.mp4", 5, 32, 48)[0] + 1) / 2
    import PIL.Image

    pipe = ditax.load_pipeline(folder)
    want = np.asarray(pipe.vace_condition((control + 1) / 2, mask,
                                          [PIL.Image.open(vids / "a.ref.png")], 1.0, 32, 48, 5)
                      .control)[0]
    np.testing.assert_allclose(rec["control"], want, atol=1e-5)
    np.testing.assert_allclose(rec["latents"][:, :1], want[:4, :1], atol=1e-6)   # reference
    # encoders that take no sidecars (a plain Wan folder's): refused, naming one
    with pytest.raises(RequestError, match=r"a.control.mp4: control / mask / reference "
                                           r"sidecars are for a VACE pipeline folder"):
        read_sidecars(vids / "a.mp4", (), 5, 32, 48)
    # a sidecar-named file without its clip is refused, not dropped
    (tmp_path / "c.ref.png").write_bytes((vids / "a.ref.png").read_bytes())
    (tmp_path / "d.png").write_bytes((vids / "a.ref.png").read_bytes())
    (tmp_path / "d.txt").write_text("a dog")
    with pytest.raises(RequestError, match=r"c.ref.png is named as a sidecar of a clip c\.\* "):
        find_samples(tmp_path)


def test_loss_equals_diffusers(dataset, one):
    """The step's loss equals mean((transformer(x_t, 1000 sigma, text, control) - (eps - x0))^2)
    with the folder's torch transformer, sigma and eps drawn from the step's key as the loss
    draws them."""
    import torch

    from ditax.train.loss import sample_sigmas
    from wan_reference import rel_err

    tr, batch, _, before, _, metrics = one
    key = jax.random.fold_in(jax.random.wrap_key_data(before["key"]), 0)
    k_sigma, k_noise = jax.random.split(key)
    x0 = batch["latents"]
    sigma = np.asarray(sample_sigmas(k_sigma, x0.shape[0], tr.cfg.flow))
    noise = np.asarray(jax.random.normal(k_noise, x0.shape))
    s = sigma[:, None, None, None, None]
    x_t = (1 - s) * x0 + s * noise
    with torch.no_grad():
        pred = dataset[0].transformer(
            torch.from_numpy(x_t.astype(np.float32)),
            torch.from_numpy((sigma * 1000).astype(np.float32)), torch.from_numpy(batch["text"]),
            control_hidden_states=torch.from_numpy(batch["control"]), return_dict=False)[0]
    want = np.mean((pred.numpy() - (noise - x0)) ** 2)
    err = rel_err(np.asarray(metrics["loss"]), want)
    print(f"VACE training loss {float(metrics['loss']):.7g} vs diffusers {want:.7g}: {err:.2e}")
    assert err < 1e-5


def test_default_trains_the_vace_branch_only(one):
    tr, _, weights, before, after, _ = one
    assert tr.cfg.train.vace_trainable == "vace"
    assert sorted(tr.params_abstract) == ["vace_blocks", "vace_patch_embedding_bias",
                                          "vace_patch_embedding_kernel", "vace_proj_in"]
    # optimiser moments exist for the trained leaves only
    moments = sorted(x.shape for x in jax.tree.leaves(after["opt"]) if x.ndim)
    assert moments == sorted([x.shape for x in jax.tree.leaves(tr.params_abstract)] * 2)
    assert _diff(after["frozen"], before["frozen"]) == 0.0       # the base: not changed
    assert _diff(before["frozen"]["blocks"], weights["blocks"]) == 0.0
    assert _diff(after["params"], before["params"]) > 0          # the VACE branch: trained
    # "all": every parameter trains; anything else refused in one line
    full = Trainer(load_config(None, [*VACE, "train.vace_trainable=all"]), tr.mesh)
    assert "blocks" in full.params_abstract and full.split is None
    with pytest.raises(ConfigError, match=r"train.vace_trainable.*vace.*all"):
        load_config(None, [*VACE, "train.vace_trainable=base"])
    with pytest.raises(ConfigError, match=r"lora.rank=4 .*train.vace_trainable=all"):
        Trainer(load_config(None, [*VACE, "lora.rank=4"]), tr.mesh)


def test_checkpoints_leave_the_frozen_base_out_and_resume_is_exact(dataset, one, tmp_path):
    """``init_from`` the folder: a checkpoint holds the VACE branch (and its optimiser state),
    not the frozen base, which a resume rebuilds from the folder: 2 + 2 steps = 4 steps."""
    from ditax.train.checkpoint import Checkpointer
    from ditax.train.loop import train

    tr, folder = one[0], dataset[1]

    def run(out, steps):
        cfg = load_config(None, [*VACE, f"data.source={dataset[3]}", f"init_from={folder}",
                                 f"output_dir={tmp_path / out}", f"steps={steps}",
                                 "checkpoint.every=2", "checkpoint.async_save=false",
                                 "mesh.fsdp=1", "mesh.context=-1"])   # (the Trainer's: one)
        return train(cfg, trainer=tr, progress=False, say=lambda m: None)

    a, b1, b2 = run("a", 4), run("b", 2), run("b", 4)
    assert b2.resumed_from == 2 and a.losses == b1.losses + b2.losses
    assert _diff(a.state, b2.state) == 0.0
    ckpt = Checkpointer(tmp_path / "b" / "checkpoints", tr.cfg.checkpoint)
    stored = ckpt.mgr.item_metadata(4)["state"]
    ckpt.close()
    assert sorted(getattr(stored, "tree", stored)) == ["key", "opt", "params", "step"]


def test_mesh_step_equals_one_device(one):
    """fsdp 2 x context 4 (Ulysses over the 4 heads) from the same weights and batch: the same
    loss and the same updated VACE branch."""
    tr, batch, weights, _, after, metrics = one
    cfg = load_config(None, [*VACE, f"data.source={tr.cfg.data.source}",
                             "attention.backend=ulysses"])
    many = Trainer(cfg, make_mesh({**ONE, "fsdp": 2, "context": 4}))
    assert many.batch_sh["control"].spec == many.batch_sh["latents"].spec
    st, m = many.step(many.init(weights), many.put_batch(batch))
    loss_err = abs(float(m["loss"]) - float(metrics["loss"])) / float(metrics["loss"])
    print(f"fsdp2 x context4 vs one device: loss {loss_err:.2e} rel, "
          f"params {_diff(st['params'], after['params']):.2e} max abs")
    assert loss_err < 1e-5
    assert _diff(st["params"], after["params"]) < 1e-5
    assert _diff(st["frozen"], after["frozen"]) == 0.0


def test_datasets_that_do_not_fit_are_refused(tmp_path, dataset):
    rng = np.random.default_rng(0)
    plain = DatasetWriter(tmp_path / "plain")
    plain.add(rng.standard_normal((4, 3, 4, 6)), rng.standard_normal((8, 32)))
    plain.close()
    with pytest.raises(DataError, match=r"no control entries.*VACE model.*--model VACE_FOLDER"):
        BatchIterator(load_config(None, [*VACE, f"data.source={tmp_path / 'plain'}"]))
    plain_cfg = [k for k in VACE if "vace" not in k]
    with pytest.raises(DataError, match=r"stores VACE control entries.*model.vace_layers"):
        BatchIterator(load_config(None, [*plain_cfg, f"data.source={dataset[3]}"]))
    wide = [k.replace("vace_in_channels=72", "vace_in_channels=96") for k in VACE]
    with pytest.raises(DataError, match=r"control shape \[72, 3, 4, 6\] != .*\[96, 3, 4, 6\]"):
        BatchIterator(load_config(None, [*wide, f"data.source={dataset[3]}"]))


def test_vae_training_takes_a_vace_clip_folder_without_its_sidecars(tmp_path):
    """``ditax train-vae`` on a VACE clip folder: the clips, not their mask / control videos or
    reference images (as ``ditax preprocess`` reads the folder)."""
    from ditax.train.vae_clips import list_videos

    for name in ("a.mp4", "a.mask.mp4", "a.control.mp4", "a.ref.png", "a.ref2.png", "b.png",
                 "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in list_videos(tmp_path)] == ["a.mp4", "b.png"]
