"""A LoRA run's checkpoints hold the LoRA (issue 41, class 8): the adapters, their optimiser
state, step, key and data position, and a reference to the frozen base (``init_from``'s folder,
a fingerprint of its files, a checksum of the weights) instead of the base itself; resume
rebuilds the base from ``init_from`` (or, with none, from the seed) bit for bit, and refuses a
base that changed or went missing in one line naming the folder (exit 2).

The base is a tiny random Wan folder (the ``tiny`` preset's shape, written by ditax's own
export: no torch) on one device; one Trainer (one compiled step) serves every run."""

import json
import os
import pathlib
import shutil
import signal
import struct

import jax
import numpy as np
import pytest

from ditax.cli import main as cli_main
from ditax.config import load_config
from ditax.parallel.mesh import make_mesh
from ditax.train import frozen_base
from ditax.train.checkpoint import Checkpointer
from ditax.train.loop import train
from ditax.train.resume import ResumeMismatch
from ditax.train.step import Trainer
from latent_datasets import write_dataset

pytestmark = pytest.mark.usefixtures("fast_compile")
LORA = ["lora.rank=4", "lora.alpha=8", "lora.targets=attn,ffn", "optim.learning_rate=1e-2",
        "optim.warmup_steps=0", "checkpoint.every=3", "checkpoint.async_save=false"]
ONE = dict(data=1, fsdp=1, context=1, tensor=1)


def args(out, ds, base, *extra):
    return ([f"init_from={base}"] if base else []) + [
        f"data.source={ds}", f"output_dir={out}", *LORA, *extra]


def write_base(folder, seed: int = 0) -> pathlib.Path:
    """A diffusers Wan transformer folder of the ``tiny`` preset's shape, weights drawn
    ``N(0, 1) / sqrt(fan-in)`` from ``seed``."""
    from flax import nnx

    from ditax.io.export import save_folder
    from ditax.models.wan.build import abstract_model
    from ditax.models.wan.convert import config_weight_table

    cfg = load_config("tiny").model
    gen = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda a: (gen.standard_normal(a.shape) / np.sqrt(max(a.shape[0], 1)) if a.ndim else
                   gen.standard_normal(())).astype(np.float32),
        nnx.to_pure_dict(nnx.state(abstract_model(cfg))))
    save_folder(folder, "diffusion_pytorch_model.safetensors", config_weight_table(cfg),
                params, cfg.to_diffusers())
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_ckpt")
    folder = write_base(tmp / "base")
    ds = write_dataset(tmp / "latents")
    cfg = load_config("tiny", args(tmp / "unused", ds, folder))
    tr = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    return tmp, folder, ds, tr


def run(setup, out, steps, base="default", **kw):
    tmp, folder, ds, tr = setup
    cfg = load_config("tiny", args(out, ds, folder if base == "default" else base,
                                   f"steps={steps}"))
    said = []
    res = train(cfg, trainer=tr, progress=False, say=said.append, **kw)
    res.said = said
    return res


def _stop_at(step):
    """An ``on_step`` hook that sends this process SIGTERM after ``step`` (the run saves and
    stops, as under a scheduler's pre-emption)."""
    def hook(s, row):
        if s == step:
            os.kill(os.getpid(), signal.SIGTERM)
    return hook


def _size(folder) -> int:
    return sum(f.stat().st_size for f in pathlib.Path(folder).rglob("*") if f.is_file())


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def _same(a, b):
    la, lb = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_flatten_with_path(b)[0]
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (p, x), (_, y) in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(p))


@pytest.fixture(scope="module")
def runs(setup):
    """From ``init_from``: 6 steps straight (``a``); 6 steps stopped by SIGTERM after step 2
    and resumed (``b1``, ``b2``)."""
    tmp = setup[0]
    a = run(setup, tmp / "a", 6)
    b1 = run(setup, tmp / "b", 6, on_step=_stop_at(2))
    b2 = run(setup, tmp / "b", 6)
    return a, b1, b2


def test_the_checkpoint_holds_the_adapters_and_a_reference_to_the_base(setup, runs):
    tmp, folder, _, _ = setup
    a = runs[0]
    ckpt = Checkpointer(tmp / "a" / "checkpoints", load_config("tiny").checkpoint)
    stored = ckpt.mgr.item_metadata(6)["state"]
    assert sorted(getattr(stored, "tree", stored)) == ["key", "opt", "params", "step"]
    trained = _nbytes(a.state["params"]) + _nbytes(a.state["opt"])
    base = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    size = _size(tmp / "a" / "checkpoints" / "6")
    print(f"LoRA checkpoint {size} bytes: adapters {_nbytes(a.state['params'])} + Adam "
          f"{_nbytes(a.state['opt'])}; base weights {base}, frozen tree "
          f"{_nbytes(a.state['frozen'])}")
    assert size < 1.25 * trained + 96 * 1024 and 4 * size < base
    ref = frozen_base.stored_data(ckpt)[1]["base"]
    assert ref["init_from"] == str(folder) and ref["folder"] == str(folder.absolute())
    assert sorted(ref["files"]) == ["config.json", "diffusion_pytorch_model.safetensors"]
    assert ref["files"]["config.json"]["read"] == "all" and len(ref["checksum"]) == 32
    ckpt.close()


def test_stop_and_resume_is_bit_exact(runs):
    a, b1, b2 = runs
    assert b1.interrupted and b1.step == 2 and b2.resumed_from == 2
    assert a.losses == b1.losses + b2.losses
    _same(a.state, b2.state)            # adapters, Adam moments, step, key and the frozen base
    assert any("the frozen base rebuilt from" in s for s in b2.said), b2.said


def test_a_random_base_resumes_bit_exact_from_the_seed(setup):
    """No ``init_from``: the base is the seed's random draw, rebuilt on resume."""
    tmp = setup[0]
    a = run(setup, tmp / "ra", 4, base=None)
    b1 = run(setup, tmp / "rb", 2, base=None)
    b2 = run(setup, tmp / "rb", 4, base=None)
    assert b2.resumed_from == 2 and a.losses == b1.losses + b2.losses
    _same(a.state, b2.state)
    ckpt = Checkpointer(tmp / "rb" / "checkpoints", load_config("tiny").checkpoint)
    ref = frozen_base.stored_data(ckpt)[1]["base"]
    ckpt.close()
    assert ref["init_from"] is None and ref["seed"] == 0 and "files" not in ref
    # asked to resume on weights instead: refused (the adapters were trained on the seed's)
    with pytest.raises(ResumeMismatch, match=r"init_from=.*trained on a random base \(seed=0"):
        run(setup, tmp / "rb", 6)


def test_checkpoints_that_hold_the_base_resume_whole_and_keep_holding_it(setup, runs, tmp_path,
                                                                         monkeypatch):
    """A run whose checkpoints hold the frozen base (as ditax wrote them before; here the
    Trainer told to rebuild nothing) resumes from them, exactly, said in a line, and goes on
    saving the base: its checkpoints never mix the two forms."""
    tr = setup[3]
    with monkeypatch.context() as m:
        m.setattr(tr, "rebuilt", ())
        run(setup, tmp_path / "r", 6, on_step=_stop_at(2))
    ckpt = Checkpointer(tmp_path / "r" / "checkpoints", load_config("tiny").checkpoint)
    assert "base" not in frozen_base.stored_data(ckpt)[1]
    ckpt.close()
    b2 = run(setup, tmp_path / "r", 6)
    assert b2.resumed_from == 2 and any("hold the frozen base" in s for s in b2.said), b2.said
    _same(runs[0].state, b2.state)
    ckpt = Checkpointer(tmp_path / "r" / "checkpoints", load_config("tiny").checkpoint)
    stored = ckpt.mgr.item_metadata(6)["state"]
    assert "frozen" in getattr(stored, "tree", stored)
    assert "base" not in frozen_base.stored_data(ckpt)[1]
    ckpt.close()


def _edit_middle(file: pathlib.Path) -> str:
    """Add 1 to the middle element of the largest tensor of a safetensors file, in place (same
    size, same header); returns the tensor's name."""
    raw = file.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    name = max((k for k in header if k != "__metadata__"),
               key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0])
    start, end = header[name]["data_offsets"]
    assert header[name]["dtype"] == "F32"
    at = 8 + n + start + ((end - start) // 8) * 4
    value = struct.unpack("<f", raw[at:at + 4])[0] + 1.0
    with open(file, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<f", value))
    return name


def _snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(pathlib.Path(folder).rglob("*")) if p.is_file()}


def test_a_changed_moved_or_missing_base_is_refused_in_one_line(setup, tmp_path, capsys):
    _, folder, ds, _ = setup
    mine = tmp_path / "base"
    shutil.copytree(folder, mine)
    run(setup, tmp_path / "r", 3, base=mine)
    cli = ["train", "tiny", *args(tmp_path / "r", ds, mine, "steps=6"), "--no-progress"]
    before = _snapshot(tmp_path / "r")

    def refused(*extra, argv=cli):
        capsys.readouterr()
        rc = cli_main([*argv, *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, (rc, err)
        assert _snapshot(tmp_path / "r") == before          # nothing restored, nothing written
        return err[0]

    # the weights changed in place (same size): the file named, before anything restores
    _edit_middle(mine / "diffusion_pytorch_model.safetensors")
    err = refused()
    assert f"init_from={mine}: the frozen base in {mine} changed since checkpoint step 3" in err
    assert "diffusion_pytorch_model.safetensors: same size, other content" in err
    assert "choose a new output_dir" in err
    # a file of another size
    shutil.copy(folder / "diffusion_pytorch_model.safetensors", mine)
    (mine / "config.json").write_text((folder / "config.json").read_text() + "\n")
    err = refused()
    size = (folder / "config.json").stat().st_size
    assert f"config.json: {size} → {size + 1} bytes" in err
    shutil.copy(folder / "config.json", mine)
    # the folder moved: refused where it was, taken where it went (same files)
    moved = tmp_path / "moved"
    mine.rename(moved)
    err = refused()
    assert f"init_from={mine}: the frozen base of checkpoint step 3" in err and "not there" in err
    assert "set init_from to where it moved" in err
    # another folder of the same architecture: other weights, named
    other = write_base(tmp_path / "other", seed=1)
    err = refused(f"init_from={other}")
    assert (f"the frozen base in {other} holds other weights than the base checkpoint step 3 "
            f"in {tmp_path / 'r' / 'checkpoints'} was trained on ({mine})") in err
    assert f"or set init_from={mine}" in err
    # init_from dropped: refused, naming the folder to set
    no_base = [a for a in cli if not a.startswith("init_from=")]
    err = refused(argv=no_base)
    assert f"set init_from={mine}" in err
    res = run(setup, tmp_path / "r", 4, base=moved)
    assert res.resumed_from == 3 and any(f"the frozen base moved: {mine} → {moved}" in s
                                         for s in res.said), res.said


def test_a_change_the_file_samples_miss_is_caught_by_the_checksum(setup, tmp_path,
                                                                 monkeypatch):
    """A base file hashed as a large one is (header + sampled blocks): an edit between the
    samples passes the file check and is refused once the base is rebuilt, by the checksum of
    the frozen weights."""
    _, folder, _, _ = setup
    monkeypatch.setattr(frozen_base, "FULL_HASH_BYTES", 0)
    monkeypatch.setattr(frozen_base, "SAMPLES", 2)
    monkeypatch.setattr(frozen_base, "SAMPLE_BYTES", 16)
    mine = tmp_path / "base"
    shutil.copytree(folder, mine)
    run(setup, tmp_path / "r", 3, base=mine)
    ckpt = Checkpointer(tmp_path / "r" / "checkpoints", load_config("tiny").checkpoint)
    ref = frozen_base.stored_data(ckpt)[1]["base"]
    ckpt.close()
    assert ref["files"]["diffusion_pytorch_model.safetensors"]["read"] == \
        "header + 2 x 16 bytes"
    _edit_middle(mine / "diffusion_pytorch_model.safetensors")
    assert frozen_base.file_changes(ref["files"], frozen_base.fingerprint(mine)) == []
    with pytest.raises(ResumeMismatch, match=rf"init_from={mine}: the frozen base rebuilt from "
                                             rf"{mine} differs from the one checkpoint step 3 "
                                             rf".*checksum [0-9a-f]+ → [0-9a-f]+"):
        run(setup, tmp_path / "r", 6, base=mine)


def test_the_checksum_sees_each_bit_and_each_place_and_not_the_mesh():
    from jax.sharding import NamedSharding, PartitionSpec as P

    one = make_mesh(ONE, jax.devices()[:1])
    many = make_mesh(dict(ONE, fsdp=8))
    rng = np.random.default_rng(0)
    tree = {"a": rng.standard_normal((8, 6)).astype(np.float32),
            "b": {"c": rng.standard_normal((16,)).astype(jax.numpy.bfloat16)}}
    base = frozen_base.tree_checksum(jax.device_put(tree, NamedSharding(one, P())), one)
    sharded = jax.device_put(tree, NamedSharding(many, P("fsdp")))
    assert frozen_base.tree_checksum(sharded, many) == base
    flipped = {**tree, "a": tree["a"].copy()}
    flipped["a"].view(np.uint32)[3, 2] ^= 1                        # the lowest bit of one value
    swapped = {**tree, "a": tree["a"][[1, 0, *range(2, 8)]]}       # two rows change places
    for other in (flipped, swapped):
        assert frozen_base.tree_checksum(jax.device_put(other, NamedSharding(one, P())),
                                         one) != base
