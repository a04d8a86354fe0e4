"""io/weights.py (safetensors reads) and io/convert.py (tables, both directions, sharded loads)."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors.numpy import load_file, save_file

from ditax.errors import WeightError
from ditax.io import convert
from ditax.io.weights import Weights


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16) if x.dtype == ml_dtypes.bfloat16 else x


# ----------------------------------------------------------------------------- reading

def test_bf16_file_reads_exactly(tmp_path, rng):
    a = rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((3,)).astype(np.float32)
    save_file({"a": a, "b": b, "n": np.arange(5)}, tmp_path / "m.safetensors")
    for w in (Weights.open(tmp_path / "m.safetensors"), Weights.open(tmp_path)):
        assert sorted(w.keys()) == ["a", "b", "n"] and "a" in w and len(w) == 3
        assert w.shape("a") == (4, 6) and w.dtype("a") == ml_dtypes.bfloat16
        assert w.dtype("b") == np.float32 and w.dtype("n") == np.int64
        got = w.get("a")
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(_bits(got), _bits(a))
        np.testing.assert_array_equal(_bits(w.read("a", (slice(1, 3), slice(2, 5)))),
                                      _bits(a[1:3, 2:5]))
        np.testing.assert_array_equal(w.get("b"), b)


def test_sharded_checkpoint_and_broken_index(tmp_path):
    save_file({"x": np.ones((2, 2), np.float32)}, tmp_path / "m-1.safetensors")
    save_file({"y": np.zeros((3,), np.float32)}, tmp_path / "m-2.safetensors")
    index = tmp_path / "m.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"x": "m-1.safetensors", "y": "m-2.safetensors"}}))
    w = Weights.open(tmp_path)
    assert sorted(w.keys()) == ["x", "y"] and w.file("y").name == "m-2.safetensors"
    assert w.shape("y") == (3,)

    index.write_text(json.dumps({"weight_map": {"x": "m-1.safetensors", "y": "m-3.safetensors"}}))
    with pytest.raises(WeightError, match=r"names shard\(s\) that are missing: \['m-3"):
        Weights.open(tmp_path)
    index.write_text(json.dumps({"weight_map": {"x": "m-1.safetensors", "z": "m-2.safetensors"}}))
    with pytest.raises(WeightError, match=r"says z is in m-2\.safetensors, but it is not"):
        Weights.open(index)


def test_damaged_files_raise_weight_error(tmp_path):
    f = tmp_path / "m.safetensors"
    save_file({"x": np.ones((64,), np.float32)}, f)
    data = f.read_bytes()
    f.write_bytes(data[:-10])
    with pytest.raises(WeightError, match=r"m\.safetensors: .*truncated or corrupted"):
        Weights.open(tmp_path)
    f.write_bytes(b"\x05" + data[1:])  # header length no longer matches
    with pytest.raises(WeightError, match=r"m\.safetensors: .*download or save it again"):
        Weights.open(f)
    f.unlink()
    with pytest.raises(WeightError, match=r"no \*\.safetensors weights found"):
        Weights.open(tmp_path)


# ----------------------------------------------------------------------------- tables

class Tiny(nnx.Module):
    """One parameter per transform kind, plus a stacked one (leading layers axis)."""

    def __init__(self, rngs: nnx.Rngs):
        def p(*shape):
            return nnx.Param(jax.random.normal(rngs.params(), shape))
        self.dense = p(6, 8)
        self.stack = p(4, 8, 16)
        self.conv = p(1, 2, 2, 3, 8)
        self.gain = p(8)
        self.pw = p(8, 8)
        self.bias = p(8)


TABLE = convert.Table("tiny", (
    convert.Row(("dense",), "dense.weight", convert.TRANSPOSE),
    convert.Row(("stack",), "blocks.{i}.w", convert.TRANSPOSE),
    convert.Row(("conv",), "conv.weight", convert.CONV3D),
    convert.Row(("gain",), "norm.gamma", convert.unit_axes(3)),
    convert.Row(("pw",), "pw.weight", convert.POINTWISE),
    convert.Row(("bias",), "b", alt=("bias_old",)),
), layers=4, ignore=(r"^decoder\.",), context="the tiny config")

UPSTREAM_SHAPES = {"dense.weight": (8, 6), "conv.weight": (8, 3, 1, 2, 2),
                   "norm.gamma": (8, 1, 1, 1), "pw.weight": (8, 8, 1, 1), "b": (8,),
                   **{f"blocks.{i}.w": (16, 8) for i in range(4)}}


def _abstract():
    return nnx.split(nnx.eval_shape(lambda: Tiny(nnx.Rngs(0))))


def _load(folder, dtype=jnp.float32, sharding=None):
    gdef, state = _abstract()
    return nnx.merge(gdef, convert.load_params(TABLE, Weights.open(folder), state, dtype,
                                               sharding))


def test_upstream_to_ditax_to_upstream_is_identical(tmp_path, rng):
    """bf16 upstream tensors → ditax (bf16) → upstream: bit-identical, same keys."""
    theirs = {k: rng.standard_normal(s).astype(ml_dtypes.bfloat16)
              for k, s in UPSTREAM_SHAPES.items()}
    theirs["decoder.ignored"] = np.zeros(2, ml_dtypes.bfloat16)
    save_file(theirs, tmp_path / "m.safetensors")
    model = _load(tmp_path, jnp.bfloat16)
    assert model.dense[...].dtype == jnp.bfloat16
    np.testing.assert_array_equal(_bits(model.dense[...]), _bits(theirs["dense.weight"].T))
    np.testing.assert_array_equal(_bits(model.stack[...][2]), _bits(theirs["blocks.2.w"].T))
    back = convert.export(TABLE, model)
    assert sorted(back) == sorted(UPSTREAM_SHAPES)
    for k, v in back.items():
        assert v.shape == theirs[k].shape, k
        np.testing.assert_array_equal(_bits(v), _bits(theirs[k]), err_msg=k)


def test_ditax_to_upstream_to_ditax_is_identical(tmp_path):
    model = Tiny(nnx.Rngs(3))
    out = convert.export(TABLE, model)
    assert {k: v.shape for k, v in out.items()} == UPSTREAM_SHAPES
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, tmp_path / "m.safetensors")
    again = _load(tmp_path)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_key_and_shape_errors_name_the_keys(tmp_path):
    good = {k: np.zeros(s, np.float32) for k, s in UPSTREAM_SHAPES.items()}
    bad = dict(good)
    del bad["blocks.3.w"]
    bad["extra.weight"] = np.zeros(1, np.float32)
    save_file(bad, tmp_path / "m.safetensors")
    with pytest.raises(WeightError, match=r"tiny weights in .* do not match the tiny config; "
                                          r"missing 1 key\(s\): blocks\.3\.w; unexpected 1 "
                                          r"key\(s\): extra\.weight"):
        _load(tmp_path)

    wrong = dict(good)
    wrong["dense.weight"] = np.zeros((6, 8), np.float32)
    wrong["bias_old"] = wrong.pop("b")  # an alt name is read, not reported
    save_file(wrong, tmp_path / "m.safetensors")
    with pytest.raises(WeightError, match=r"dense\.weight: shape \(6, 8\) but the model expects "
                                          r"\(8, 6\) \(our dense \(6, 8\), T\)") as e:
        _load(tmp_path)
    assert "bias" not in str(e.value)
    wrong["dense.weight"] = good["dense.weight"]
    save_file(wrong, tmp_path / "m.safetensors")
    _load(tmp_path)


class Recording:
    """A Weights stand-in that records every read (key, shape read)."""

    def __init__(self, inner):
        self.inner, self.reads, self.source = inner, [], inner.source

    def keys(self):
        return self.inner.keys()

    def shape(self, k):
        return self.inner.shape(k)

    def read(self, k, index):
        x = self.inner.read(k, index)
        self.reads.append((k, x.shape))
        return x


def test_sharded_load_reads_each_shard_into_its_device(tmp_path):
    """8 devices: every shard holds exactly its slice, read on its own (never the full tensor)."""
    model = Tiny(nnx.Rngs(5))
    save_file({k: np.ascontiguousarray(v) for k, v in convert.export(TABLE, model).items()},
              tmp_path / "m.safetensors")
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=jax.devices()[:8])
    specs = {("dense",): P(None, "b"), ("stack",): P("a", None, "b"),
             ("conv",): P(None, None, None, None, ("a", "b")), ("gain",): P(),
             ("pw",): P("a", "b"), ("bias",): P("b")}
    rec = Recording(Weights.open(tmp_path))
    gdef, state = _abstract()
    state = convert.load_params(TABLE, rec, state, jnp.float32,
                                lambda path, shape: NamedSharding(mesh, specs[path]))
    loaded = nnx.merge(gdef, state)
    for path, spec in specs.items():
        want = np.asarray(getattr(model, path[0])[...])
        arr = getattr(loaded, path[0])[...]
        assert arr.sharding == NamedSharding(mesh, spec), path
        assert len(arr.addressable_shards) == 8
        for s in arr.addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), want[s.index], err_msg=str(path))
            if spec != P():
                assert s.data.shape != want.shape, path  # no device holds the full tensor
    # reads are shard-sized: dense [6, 8] split 4 ways on its out axis -> stored [2, 6] slices
    assert {shape for k, shape in rec.reads if k == "dense.weight"} == {(2, 6)}
    # stacked: 2 layers per shard along "a", 16/4 columns -> per-layer reads of [4, 8]
    assert {shape for k, shape in rec.reads if k.startswith("blocks.")} == {(4, 8)}
    # a replicated parameter is read once, not once per device
    assert sum(k == "norm.gamma" for k, _ in rec.reads) == 1


# ----------------------------------------------------------------------------- model tables

def test_transformer_diffusers_to_ditax_to_diffusers(tmp_path):
    """A diffusers-saved transformer → ditax (sharded on 8 devices) → export: identical."""
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    import ditax
    from ditax.models.wan.convert import weight_table
    from ditax.parallel import make_mesh
    from wan_reference import make_diffusers_wan

    _, folder = make_diffusers_wan(tmp_path, heads=4, layers=2)
    theirs = load_file(next(folder.glob("*.safetensors")))
    tr = ditax.load_transformer(folder, mesh=make_mesh(dict(fsdp=2, tensor=4)))
    cfg = tr.config
    back = convert.export(weight_table(cfg.num_layers, cfg.cross_attn_norm,
                                       head_dim=cfg.attention_head_dim), tr.module)
    assert sorted(back) == sorted(theirs)
    for k, v in back.items():
        np.testing.assert_array_equal(v, theirs[k], err_msg=k)


def _random_params(abstract, rng):
    """Random float32 values for every parameter of an abstract module (no eager init)."""
    pure = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    return jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(np.float32), pure)


@pytest.mark.parametrize("model", ["vae", "text_encoder"])
def test_vae_and_umt5_ditax_to_upstream_to_ditax(tmp_path, rng, model):
    """Random params → export (upstream layout) → save → load: bit for bit, every parameter."""
    from ditax.demo import folders as demo
    from ditax.models.encoders import t5, umt5
    from ditax.models.vae.wan import convert as vae_convert
    from ditax.models.vae.wan import WanVAE, WanVAEConfig

    if model == "vae":
        abstract = nnx.eval_shape(lambda: WanVAE(WanVAEConfig.from_diffusers(demo.VAE),
                                                 rngs=nnx.Rngs(0)))
        table, config = vae_convert.weight_table(abstract), dict(demo.VAE)
        name, load = "diffusion_pytorch_model.safetensors", vae_convert.load_vae
    else:
        cfg = umt5.UMT5Config.from_hf(demo.UMT5)
        abstract = nnx.eval_shape(lambda: umt5.UMT5Encoder(cfg, rngs=nnx.Rngs(0)))
        table, config = t5.weight_table(cfg), dict(demo.UMT5)
        name, load = "model.safetensors", umt5.load_text_encoder
    params = _random_params(abstract, rng)
    folder = tmp_path / model
    folder.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in convert.export(table, params).items()},
              folder / name)
    (folder / "config.json").write_text(json.dumps(config))
    loaded = nnx.to_pure_dict(nnx.state(load(tmp_path), nnx.Param))  # pipeline-style folder
    want = jax.tree_util.tree_leaves_with_path(params)
    got = dict(jax.tree_util.tree_leaves_with_path(loaded))
    assert len(want) == len(got) == len(table.rows)
    for path, v in want:
        np.testing.assert_array_equal(np.asarray(got[path]), v, err_msg=str(path))
