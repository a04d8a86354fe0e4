"""The one sharding context (parallel/sharding.py): a model holds its mesh once, its blocks and
attention calls get that same object, and no layer keeps a mesh of its own."""

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from ditax.config import AttentionConfig, ModelConfig
from ditax.models.wan import transformer as T
from ditax.models.wan.build import init_model
from ditax.models.wan.loading import Transformer
from ditax.parallel import make_mesh
from ditax.parallel.sharding import ShardingContext, sharding_context

CFG = ModelConfig(num_attention_heads=4, attention_head_dim=16, num_layers=2, in_channels=4,
                  out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, scan_layers=False)


def test_context_questions_without_and_with_a_mesh():
    none = ShardingContext()
    x = np.ones((2, 3), np.float32)
    assert none.constrain(x, ("act_batch", "act_seq")) is x and none.seq_shards == 1
    mesh = make_mesh({"fsdp": 2, "context": 4})
    ctx = sharding_context(mesh)
    assert ctx.mesh is mesh and ctx.seq_shards == 4 and sharding_context(ctx) is ctx
    assert ctx == ShardingContext(mesh) and hash(ctx) == hash(ShardingContext(mesh))
    placed = ctx.put_batch(np.ones((4, 3), np.float32))
    assert placed.sharding.spec[0] == "fsdp"


def test_blocks_and_attention_share_the_models_one_context(monkeypatch, rng):
    mesh = make_mesh({"fsdp": 2, "context": 2, "tensor": 2})
    model = init_model(CFG, AttentionConfig(backend="ulysses"), mesh, seed=0)
    ctx = model.sharding
    assert isinstance(ctx, ShardingContext) and ctx.mesh is mesh and model.mesh is mesh
    plan = model.attention_plan
    assert plan.sharding is ctx and plan.self_attn.sharding is ctx
    assert plan.cross_attn.sharding is ctx and plan.mesh is mesh

    # no layer holds a mesh, and only the model holds the context
    for path, module in nnx.iter_modules(model):
        own = vars(module)
        assert "mesh" not in own, path
        assert ("sharding" in own) == (path == ()), path

    # every block (and each of its attention layers and FFN) is called with that one object
    seen = []
    for cls, pos in ((T.WanBlock, 7), (T.WanAttention, 3), (T.FeedForward, 1)):
        def spy(self, *a, _orig=cls.__call__, _pos=pos, **kw):
            seen.append(a[_pos])
            return _orig(self, *a, **kw)
        monkeypatch.setattr(cls, "__call__", spy)
    lat = rng.standard_normal((2, 4, 2, 4, 4)).astype(np.float32)
    t = np.full((2,), 500.0, np.float32)
    text = rng.standard_normal((2, 5, 32)).astype(np.float32)
    out = jax.eval_shape(lambda *a: model(*a), lat, t, text)   # traced afresh (no jit cache)
    assert len(seen) == CFG.num_layers * 4 and all(s is ctx for s in seen)
    assert out.shape == lat.shape

    # the wrapper reads the module's mesh (no copy of its own), also after a pytree round trip
    tr = Transformer(model)
    assert tr.mesh is mesh and not any(isinstance(a, Mesh) for a in tr.tree_flatten()[1])
    leaves, tree = jax.tree.flatten(tr)
    assert jax.tree.unflatten(tree, leaves).mesh == mesh
