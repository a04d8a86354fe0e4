"""Layers shared by every model: linear, norms, timestep / text embedders, rotary embeddings.

Nothing here knows a model family. Parameter names (``kernel``, ``bias``, ``scale``,
``linear_1``…) are part of each model's weights table, so they do not change. Dtype arguments
take a name or a dtype (``jnp.dtype(name)`` resolves both).
"""

from ditax.nn.embeddings import TextProjection, TimestepEmbedding, timestep_embedding
from ditax.nn.linear import Linear
from ditax.nn.norms import FP32LayerNorm, RMSNorm
from ditax.nn.rope import apply_rope, axial_rope_angles, pair_tables

__all__ = ["Linear", "RMSNorm", "FP32LayerNorm", "timestep_embedding", "TimestepEmbedding",
           "TextProjection", "axial_rope_angles", "apply_rope",
           "pair_tables"]
