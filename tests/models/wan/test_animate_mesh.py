"""Wan 2.2 Animate transformer on a sharded mesh: ulysses_ring (2 Ulysses shards, as the model
has 2 heads, x a ring of 2) on context 4 x fsdp 2, the face adapters, pose embedding and motion /
face encoders under the model's attention plan and parameter shardings, equals the one-device
forward within 1e-5 relative, on the tiny random model of test_animate_transformer.py (its
module fixture, built once here)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
import jax  # noqa: E402
from ditax.config import AttentionConfig  # noqa: E402
from ditax.parallel import make_mesh  # noqa: E402
from test_animate_transformer import _inputs, _ours, animate  # noqa: E402,F401  (module fixture)
from wan_reference import rel_err  # noqa: E402


def test_context_ulysses_ring_fsdp_equals_one_device(animate):
    _, folder, single = animate
    tr = ditax.load_transformer(folder, mesh=make_mesh({"context": 4, "fsdp": 2}),
                                attention=AttentionConfig(backend="ulysses_ring", ulysses_shards=2,
                                                          local="xla"))
    k = tr.module.blocks.attn1.to_q.kernel[...]
    assert k.sharding.shard_shape(k.shape) != k.shape     # parameters really sharded
    inp = _inputs(2)
    got, want = _ours(tr, inp), _ours(single, inp)
    err = rel_err(got, want)
    print(f"animate ulysses_ring context4 x fsdp2 vs one device: rel err {err:.2e}")
    assert got.shape == want.shape and err <= 1e-5, err


def test_tensor_heads_and_mlp_with_a_context_ring_equal_one_device(animate):
    """tensor 2 (each of the 2 heads and half of every MLP per shard, the face adapters' and
    encoders' linears too) x a ring of 2 on context x fsdp 2 equals one device."""
    _, folder, single = animate
    tr = ditax.load_transformer(folder, mesh=make_mesh({"tensor": 2, "context": 2, "fsdp": 2}),
                                attention=AttentionConfig(backend="ring", local="xla"))
    k = tr.module.blocks.attn1.to_q.kernel[...]
    assert "tensor" in jax.tree.leaves(tuple(k.sharding.spec))   # heads split over tensor
    inp = _inputs(3)
    got, want = _ours(tr, inp), _ours(single, inp)
    err = rel_err(got, want)
    print(f"animate tensor2 x ring2 x fsdp2 vs one device: rel err {err:.2e}")
    assert got.shape == want.shape and err <= 1e-5, err
