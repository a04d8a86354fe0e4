"""The head every family's DiT module starts with.

:meth:`DiT.setup` stores the model config, the attention config (an
:class:`~ditax.attention.config.AttentionConfig`, or ``None`` = ``xla`` everywhere), the one
:class:`~ditax.parallel.sharding.ShardingContext` that holds the mesh, and the attention plan
for the model's heads (static: part of the compiled program,
:func:`ditax.attention.plan_attention`). The configs are the caller's, coerced and checked once
at its entry point (the loader, ``ditax.validate``), not here.
"""

from __future__ import annotations

from flax import nnx

from ditax.attention import plan_attention
from ditax.attention.config import AttentionConfig
from ditax.parallel.sharding import ShardingContext


class DiT(nnx.Module):
    """Base of a family's transformer module (``cfg`` with ``num_attention_heads``,
    ``attention_head_dim`` and ``dtype``)."""

    def setup(self, cfg, attention, mesh) -> None:
        self.cfg = cfg
        self.attention = AttentionConfig() if attention is None else attention
        self.sharding = ShardingContext(mesh)   # the one holder of the mesh
        self.attention_plan = plan_attention(
            self.attention, self.sharding, num_heads=cfg.num_attention_heads,
            head_dim=cfg.attention_head_dim, dtype=cfg.dtype)

    @property
    def mesh(self):
        """The device mesh the model is sharded over (None: one device), from its
        :attr:`sharding` context (:class:`ditax.models.base.Denoiser`)."""
        return self.sharding.mesh
