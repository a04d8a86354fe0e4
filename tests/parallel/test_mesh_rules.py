"""The mesh, its axis questions and the logical-axis rules (parallel/mesh.py, axes.py, rules.py)."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from ditax.errors import ConfigError
from ditax.parallel import make_mesh, param_spec
from ditax.parallel.axes import batch_entry, check_batch_divides, head_shards, seq_shards


def test_batch_divisibility_and_axis_questions():
    mesh = make_mesh({"data": 2, "fsdp": 4})
    msg = r"is not divisible by mesh.data\*mesh.fsdp = 2\*4 = 8; use a batch that is a multiple"
    with pytest.raises(ConfigError, match=r"batch=6 " + msg):
        check_batch_divides(6, mesh)
    check_batch_divides(16, mesh)
    check_batch_divides(3, None)
    ctx = make_mesh({"fsdp": 2, "context": 2, "tensor": 2})
    assert (seq_shards(ctx), head_shards(ctx), batch_entry(ctx), batch_entry(None)) == (
        2, 2, "fsdp", None)


def test_mesh_and_param_rules():
    mesh = make_mesh({"data": 1, "fsdp": 2, "context": 2, "tensor": 2})
    assert mesh.axis_names == ("data", "fsdp", "context", "tensor")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "context": 2, "tensor": 2}
    assert param_spec(("embed", "heads"), mesh, (128, 64)) == P(("fsdp", "context"), "tensor")
    # a dimension the axes do not divide is replicated along them (parameters only)
    assert param_spec(("embed",), mesh, (6,)) == P("fsdp")
    assert param_spec(("embed",), mesh, (3,)) == P(None)
    full = make_mesh({"fsdp": -1})
    assert full.shape["fsdp"] == jax.device_count()
