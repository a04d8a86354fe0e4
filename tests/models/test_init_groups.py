"""Random init in groups (:func:`ditax.models.common.loaded.init_module`): a device holds one
group's draws at a time, and every grouping draws exactly the one-program init's values into
the same places (device shards, host memory, 8-bit kernels)."""

import jax
import numpy as np
import pytest

from ditax.config import load_config
from ditax.models.common import loaded
from ditax.models.wan.build import _BUILD
from ditax.parallel.mesh import make_mesh


def test_groups_are_consecutive_runs_within_the_budget():
    assert loaded.init_groups([5, 5, 20, 1, 1, 9], 10) == [[0, 1], [2], [3, 4], [5]]
    assert loaded.init_groups([5, 5, 20], None) == [[0, 1, 2]]
    assert loaded.init_groups([], 10) == []
    sizes = np.random.default_rng(0).integers(1, 50, 40).tolist()
    groups = loaded.init_groups(sizes, 60)
    assert sum(groups, []) == list(range(40))
    assert all(sum(sizes[i] for i in g) <= 60 or len(g) == 1 for g in groups)


@pytest.mark.parametrize("extra", [pytest.param([], marks=pytest.mark.slow),   # 9 s
                                   ["model.quantize=int8", "model.offload=host"]])
def test_grouped_init_draws_the_one_program_values_in_place(extra, monkeypatch):
    """A tiny Wan sharded over 2 devices (fsdp), in groups of at most 64 KiB and draws in
    chunks of 4096 elements: many programs, and every parameter equals the plain jitted
    init's bit for bit, with its sharding and memory kind (host for offloaded blocks)."""
    monkeypatch.setattr(loaded, "DRAW_CHUNK", 4096)
    cfg = load_config("tiny", ["model.param_dtype=bfloat16", *extra])
    mesh = make_mesh(dict(data=1, fsdp=2, context=1, tensor=1), jax.devices()[:2])
    gdef, init, out = loaded._init_parts(*_BUILD._init(cfg.model, cfg.attention, mesh, 0))
    whole = jax.tree_util.tree_leaves(jax.jit(init, out_shardings=out)())
    sizes = [x.size * x.dtype.itemsize for x in whole]
    assert len(loaded.init_groups(sizes, 1 << 16)) > 3
    parts = jax.tree_util.tree_leaves(loaded.run_grouped(init, out, 1 << 16))
    assert len(parts) == len(whole)
    kinds = set()
    for a, b in zip(parts, whole):
        assert a.dtype == b.dtype and a.sharding == b.sharding
        kinds.add(a.sharding.memory_kind)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if extra:
        assert "pinned_host" in kinds and any(x.dtype == np.int8 for x in parts)


def test_init_module_groups_where_the_device_reports_its_memory():
    """CPU devices report no memory limit: one program; a mesh of devices that do gets a
    quarter of the first one's limit."""
    mesh = make_mesh(dict(data=1, fsdp=1, context=1, tensor=1), jax.devices()[:1])
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    expected = None if not limit else int(limit) // 4
    assert loaded.default_group_bytes(mesh) == expected
    assert loaded.default_group_bytes(None) is None
