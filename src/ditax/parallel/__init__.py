"""Mesh construction, logical-axis rules, the sharding context layers get, and
sequence-parallel collectives."""

from ditax.parallel.mesh import MESH_AXES, initialize_distributed, make_mesh
from ditax.parallel.rules import (
    ACTIVATION_RULES,
    PARAM_RULES,
    activation_spec,
    constrain,
    logical_to_spec,
    param_spec,
)
from ditax.parallel.sharding import ShardingContext

__all__ = [
    "MESH_AXES", "make_mesh", "initialize_distributed", "PARAM_RULES", "ACTIVATION_RULES",
    "logical_to_spec", "param_spec", "activation_spec", "constrain", "ShardingContext",
]
