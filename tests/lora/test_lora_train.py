"""LoRA fine-tuning: only the adapters train (gradients, optimiser state), loss goes down, exact
resume, a mesh equals one device, and the saved files load in diffusers and ditax alike.

The base model is a tiny random diffusers Wan (the ``tiny`` preset's shape) used as
``init_from``; XLA runs with most optimisations off (``fast_compile``)."""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import ditax  # noqa: E402
from ditax.config import ConfigError, load_config  # noqa: E402
from ditax.lora.export import ORIGINAL_FILE, PEFT_FILE  # noqa: E402
from ditax.parallel.mesh import make_mesh  # noqa: E402
from ditax.train.batches import BatchIterator  # noqa: E402
from ditax.train.loop import train  # noqa: E402
from ditax.train.step import Trainer  # noqa: E402
from lora_reference import load_into_diffusers  # noqa: E402
from latent_datasets import write_dataset  # noqa: E402
from wan_reference import make_diffusers_wan, rel_err, run_diffusers  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_compile")
LORA = ("lora.rank=4", "lora.alpha=8", "lora.targets=attn,ffn", "optim.learning_rate=1e-2",
        "optim.warmup_steps=0")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_train")
    _, folder = make_diffusers_wan(tmp, heads=4, head_dim=32, layers=2, ffn=256, text_dim=64,
                                   in_ch=16)
    return folder, write_dataset(tmp / "latents")


def cfg_for(out, base, *extra):
    folder, ds = base
    return load_config("tiny", [f"init_from={folder}", f"data.source={ds}", f"output_dir={out}",
                                "checkpoint.every=2", *LORA, *extra])


@pytest.fixture(scope="module")
def trainer(base):
    cfg = cfg_for("unused", base)
    return Trainer(cfg, make_mesh(cfg.mesh))


def test_config_rules():
    assert load_config("tiny").lora.rank == 0
    with pytest.raises(ConfigError, match="lora.targets"):
        ditax.config.validate(load_config("tiny", ["lora.rank=4", "lora.targets=attn,mlp"]))


def test_only_adapters_train_resume_is_exact_and_the_files_load_in_diffusers_and_ditax(
        base, tmp_path, trainer):
    """One 6-step run (and the same run stopped at 3 and resumed): only the adapters train,
    resume is exact, and the run's saved PEFT and original files load in diffusers and ditax
    alike (one run for both: the exported files are those of run ``a``)."""
    from diffusers import WanTransformer3DModel

    a = train(cfg_for(tmp_path / "a", base, "steps=6"), trainer=trainer, progress=False)
    b1 = train(cfg_for(tmp_path / "b", base, "steps=3"), trainer=trainer, progress=False)
    b2 = train(cfg_for(tmp_path / "b", base, "steps=6"), trainer=trainer, progress=False)
    assert b2.resumed_from == 3 and a.losses == b1.losses + b2.losses
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b2.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # trainable = adapters only; optimiser moments exist only for them; the base is unchanged
    paths = [tuple(str(getattr(k, "key", k)) for k in p)
             for p, _ in jax.tree_util.tree_flatten_with_path(a.state["params"])[0]]
    assert paths and all(p[-1] in ("lora_down", "lora_up") for p in paths)
    assert len(paths) == 2 * 10      # 8 attention + 2 feed-forward Linears, stacked over layers
    shapes = sorted(x.shape for x in jax.tree.leaves(a.state["params"]))
    moments = sorted(x.shape for x in jax.tree.leaves(a.state["opt"]) if x.ndim)
    assert moments == sorted(shapes * 2)
    fresh = trainer.init(trainer.family.load_params(base[0], trainer.mesh))
    for x, y in zip(jax.tree.leaves(a.state["frozen"]), jax.tree.leaves(fresh["frozen"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert (tmp_path / "a" / PEFT_FILE).is_file() and (tmp_path / "a" / ORIGINAL_FILE).is_file()
    # the saved files: diffusers and ditax read them as the same trained LoRA
    folder = base[0]
    rng = np.random.default_rng(0)
    inputs = (rng.standard_normal((1, 16, 2, 8, 8)).astype(np.float32),
              np.array([700.0], np.float32), rng.standard_normal((1, 16, 64)).astype(np.float32))
    plain = run_diffusers(WanTransformer3DModel.from_pretrained(folder).eval(), *inputs)
    for name in (PEFT_FILE, ORIGINAL_FILE):
        m = WanTransformer3DModel.from_pretrained(folder).eval()
        load_into_diffusers(m, tmp_path / "a" / name, "trained", 1.0)
        want = run_diffusers(m, *inputs)
        assert rel_err(want, plain) > 1e-3         # the adapters really changed the model
        got = np.asarray(ditax.load_transformer(folder, loras=[(tmp_path / "a" / name, 1.0)])(
            *inputs))
        assert rel_err(got, want) <= 1e-5, (name, rel_err(got, want))


def test_loss_goes_down(base, trainer):
    cfg = cfg_for("unused", base)
    st = trainer.init(trainer.family.load_params(base[0], trainer.mesh))
    batch = trainer.put_batch(next(BatchIterator(cfg)))

    def held_out(st):
        """The mean loss on the same 4 noise draws before and after: the train step's own
        loss (of the parameters it is given, before its update) on a copy of the state whose
        step counter is set to 0..3 (the step's key is the state's key folded with it), so no
        second program compiles."""
        host = jax.tree.map(np.asarray, st)
        losses = []
        for k in range(4):
            copy = jax.device_put(dict(host, step=np.int32(k)), trainer.state_sh)
            losses.append(float(trainer.step(copy, batch)[1]["loss"]))
        return np.mean(losses)

    before = held_out(st)
    for _ in range(10):
        st, _ = trainer.step(st, batch)
    assert held_out(st) < 0.99 * before, (held_out(st), before)


def test_mesh_equals_one_device(base, trainer):
    cfg = cfg_for("unused", base)
    batch = next(BatchIterator(cfg))
    one = Trainer(cfg, make_mesh(dict(data=1, fsdp=1, context=1, tensor=1), jax.devices()[:1]))
    params = jax.tree.map(np.asarray, trainer.family.load_params(base[0], one.mesh))
    s1, m1 = one.step(one.init(params), one.put_batch(batch))
    s8, m8 = trainer.step(trainer.init(params), trainer.put_batch(batch))
    assert abs(float(m1["loss"]) - float(m8["loss"])) < 1e-5
    for x, y in zip(jax.tree.leaves(s1["params"]), jax.tree.leaves(s8["params"])):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)
