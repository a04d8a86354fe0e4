"""``model.offload=host``: the stacked blocks' matrices in host memory (``pinned_host``), each
block's put in device memory as the blocks run (:mod:`ditax.nn.offload`).

On CPU the host and device memories are one RAM, so an offloaded model must equal the resident
one bit for bit: the Wan demo transformer on one device and on fsdp 2 x context 4, the Flux demo
transformer, 8-bit weights, every path of ``run_stack`` (scan with prefetch 0 / 1 / 3, a
sub-range as the step cache runs, unrolled, remat), the sampling loop (FLUX.1 with its text
encoders kept on the host), and a LoRA training step
(frozen base on the host, adapters on the device). Full training with offload is refused in
one line. The compiled TPU program's transfers are in tests/plan/test_offload_tpu.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ditax
from ditax.nn.offload import HOST, host_bytes, is_host
from ditax.nn.stack import make_stack, run_stack
from ditax.parallel.mesh import make_mesh

DEMO = "src/ditax/assets/demo_model"
FLUX = "src/ditax/assets/flux_demo_model"


def _same(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _wan_inputs(cfg, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((2, cfg.in_channels, 3, 8, 8)), jnp.float32)
    text = jnp.asarray(rng.standard_normal((2, 16, cfg.text_dim)), jnp.float32)
    return x, jnp.asarray([500.0, 300.0]), text


@pytest.mark.parametrize("mesh", [None, "fsdp2_context4"])
def test_offloaded_wan_equals_resident(mesh):
    """The blocks' matrices live on the host (their bytes counted there, nothing else), the
    forward equals the resident model's bit for bit, with prefetch 1 (default) and 0."""
    m = None if mesh is None else make_mesh(dict(fsdp=2, context=4))
    resident = ditax.load_transformer(DEMO, mesh=m)
    streamed = ditax.load_transformer(DEMO, mesh=m, offload="host")
    assert host_bytes(jax.tree.leaves(resident)) == 0
    on_host = [x for x in jax.tree.leaves(streamed) if x.sharding.memory_kind == HOST]
    blocks = jax.tree.leaves(nnx.state(streamed.module.blocks))
    assert {id(x) for x in on_host} <= {id(x) for x in blocks}      # only the blocks' ...
    assert all(x.ndim >= 3 for x in on_host)                        # ... matrices
    share = sum(x.nbytes for x in on_host) / sum(x.nbytes for x in blocks)
    assert share > 0.95, share                                      # nearly all their bytes
    x, t, text = _wan_inputs(resident.config)
    want = resident(x, t, text)
    _same(streamed(x, t, text), want)
    if mesh is None:
        no_prefetch = ditax.load_transformer(DEMO, offload="host", offload_prefetch=0)
        _same(no_prefetch(x, t, text), want)


def test_offloaded_int8_equals_resident():
    """An int8 Wan offloaded (its 8-bit kernels on the host, scales on the device) equals int8
    resident."""
    q = ditax.load_transformer(DEMO, quantize="int8")
    qs = ditax.load_transformer(DEMO, quantize="int8", offload="host")
    assert any(x.dtype == jnp.int8 and x.sharding.memory_kind == HOST
               for x in jax.tree.leaves(qs))
    x, t, text = _wan_inputs(q.config, 1)
    _same(qs(x, t, text), q(x, t, text))


def test_offloaded_loras_equal_resident(tmp_path):
    """A LoRA on every block's ``attn1.to_q`` (PEFT keys), merged at load and unmerged
    (``LoraLinear``: its factors on the device beside the host kernel): offloaded equals
    resident; the LoRA moves the output."""
    from safetensors.numpy import save_file

    base = ditax.load_transformer(DEMO)
    cfg = base.config
    d, rng, tensors = cfg.inner_dim, np.random.default_rng(2), {}
    for i in range(cfg.num_layers):
        key = f"transformer.blocks.{i}.attn1.to_q"
        tensors[f"{key}.lora_A.weight"] = (0.1 * rng.standard_normal((2, d))).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = (0.1 * rng.standard_normal((d, 2))).astype(np.float32)
    save_file(tensors, str(tmp_path / "l.safetensors"))
    loras = [(str(tmp_path / "l.safetensors"), 0.8)]
    x, t, text = _wan_inputs(cfg, 2)
    for mode in ("merged", "unmerged"):
        want = ditax.load_transformer(DEMO, loras=loras, lora_mode=mode)(x, t, text)
        got = ditax.load_transformer(DEMO, loras=loras, lora_mode=mode, offload="host")
        _same(got(x, t, text), want)
    assert float(jnp.max(jnp.abs(want - base(x, t, text)))) > 1e-3


class _Block(nnx.Module):
    def __init__(self, rngs):
        self.w = nnx.Param(jax.random.normal(rngs.params(), (6, 6)) * 0.3)
        self.b = nnx.Param(jax.random.normal(rngs.params(), (6,)))

    def __call__(self, h):
        return jnp.tanh(h @ self.w[...] + self.b[...])


@pytest.mark.parametrize("kw", [dict(prefetch=0), dict(prefetch=1), dict(prefetch=3),
                                dict(prefetch=1, start=1, stop=4), dict(scan=False),
                                dict(prefetch=1, remat="full")])
def test_every_stack_path_equals_resident(kw):
    """``run_stack`` over 5 blocks whose matrices are on the host: scanned with 0 / 1 / 3
    blocks prefetched, a sub-range (the step cache's), unrolled and under remat — the resident
    stack's result (to float rounding: with host weights the scan runs over layer indices, a
    program of another shape than ``nnx.scan``'s)."""
    blocks = make_stack(_Block, 5, nnx.Rngs(0))
    gdef, state = nnx.split(blocks)
    dev = jax.devices()[0]
    host = jax.tree.map(lambda x: jax.device_put(x, jax.sharding.SingleDeviceSharding(
        dev, memory_kind=HOST)) if x.ndim == 3 else x, state)
    assert sum(is_host(x) for x in jax.tree.leaves(host)) == 1
    h = jax.random.normal(jax.random.key(1), (4, 6))
    kw = dict(kw)
    prefetch = kw.pop("prefetch", 0)

    @jax.jit
    def run(state, h):
        return run_stack(nnx.merge(gdef, state), lambda c, b: b(c), h, depth=5,
                         prefetch=prefetch, **kw)

    np.testing.assert_allclose(np.asarray(run(host, h)), np.asarray(run(state, h)),
                               rtol=1e-6, atol=1e-6)


def _encoder_memory(path, pipe) -> set:
    from ditax.pipelines.family import folder_pipelines

    encoders = folder_pipelines(path)[1].text_encoders(pipe)
    assert encoders
    return {x.sharding.memory_kind for e in encoders for x in jax.tree.leaves(nnx.state(e))}


def test_flux_offloaded_gives_the_same_image():
    """FLUX.1 (double and single block stacks) with ``offload="host"``: its blocks and its
    CLIP and T5 weights in host memory (``text_offload`` follows ``offload``), still there
    after the call (on the device only inside the encode programs), the image equal to the
    resident pipeline's; ``text_offload="none"`` keeps the encoders on the device; a bad value
    is one line."""
    from ditax.errors import ConfigError

    call = dict(num_inference_steps=2, seed=0, height=32, width=32, progress=False)
    a = ditax.load_pipeline(FLUX)
    b = ditax.load_pipeline(FLUX, offload="host")
    assert _encoder_memory(FLUX, b) == {HOST}
    assert host_bytes(jax.tree.leaves(nnx.state(b.transformer.module))) > 0
    assert _encoder_memory(FLUX, a) == {"device"}
    _same(b("a red ball", **call), a("a red ball", **call))
    assert _encoder_memory(FLUX, b) == {HOST}
    c = ditax.load_pipeline(FLUX, offload="host", text_offload="none")
    assert _encoder_memory(FLUX, c) == {"device"}
    with pytest.raises(ConfigError, match="text_offload='gpu'"):
        ditax.load_pipeline(FLUX, text_offload="gpu")


def test_lora_step_with_offload_equals_resident(tmp_path):
    """One LoRA step with the frozen base on the host equals the resident step (loss, gradient
    norm, adapters) bit for bit (one device: the meshes' streaming is the forward's, above);
    full training with offload is one line."""
    from latent_datasets import write_dataset

    from ditax.config import ConfigError, load_config, validate
    from ditax.train.batches import BatchIterator
    from ditax.train.step import Trainer

    ds = write_dataset(tmp_path / "ds", n=4)
    common = ["lora.rank=2", f"data.source={ds}", "data.shuffle=false", "batch_size=1"]
    runs = []
    for extra in ([], ["model.offload=host"]):
        cfg = load_config("tiny", common + extra)
        tr = Trainer(cfg, make_mesh(dict(fsdp=1), jax.devices()[:1]))
        state = tr.init()
        if extra:
            assert host_bytes(state["frozen"]) > 0 and host_bytes(state["params"]) == 0
        new, m = tr.step(state, tr.put_batch(next(BatchIterator(cfg))))
        runs.append((float(m["loss"]), float(m["grad_norm"]), new["params"]))
    assert runs[0][:2] == runs[1][:2]
    jax.tree.map(_same, runs[1][2], runs[0][2])
    with pytest.raises(ConfigError, match="model.offload=host keeps the blocks") as e:
        validate(load_config("tiny", ["model.offload=host"]), 8, training=True)
    assert len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize("over, words", [
    ({"offload": "disk"}, "model.offload='disk'"),
    ({"offload": "host", "offload_prefetch": -1}, "model.offload_prefetch=-1"),
    ({"offload": "host", "offload_prefetch": 9}, "model.offload_prefetch=9"),
])
def test_bad_offload_settings_are_one_line(over, words):
    from ditax.errors import ConfigError

    with pytest.raises(ConfigError, match=words) as e:
        ditax.load_transformer(DEMO, **over)
    assert len(str(e.value).splitlines()) == 1
