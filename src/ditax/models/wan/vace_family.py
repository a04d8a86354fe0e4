"""What the Wan family interface (:class:`~ditax.models.wan.family.WanFamily`) does for a VACE
config (a ``model:`` section with ``vace_layers``, e.g. the ``wan2.1-vace-*`` presets): its
rules, module, shardings, tables, the control context each sample carries, the FLOPs of the
VACE branch and which parameters a run trains — so ``ditax train`` / ``plan`` build, shard,
load (``init_from`` a ``WanVACETransformer3DModel`` folder) and train the VACE transformer.

Per sample: ``control`` ``[vace_in_channels, F, Y, X]``, the control context on the latents'
grid (:func:`ditax.models.wan.vace_context.control_context`, stored by ``ditax preprocess``);
reference images are latent frames of both (the first ``n``), as VACE's latent space has
them. The hints' scales are 1 in training (diffusers' ``conditioning_scale`` default).
"""

from __future__ import annotations

from ditax.models.wan import vace_convert
from ditax.models.wan.vace import WanVaceTransformer, check_vace, vace_config


def is_vace(m) -> bool:
    return bool(getattr(m, "vace_layers", ()))


def check(m) -> None:
    check_vace(m)


def create(m, attention, mesh, rngs) -> WanVaceTransformer:
    return WanVaceTransformer(vace_config(m), attention, mesh, rngs=rngs)


def param_shardings(state, m, mesh):
    return vace_convert.param_shardings(state, vace_config(m), mesh)


def weight_table(m):
    return vace_convert.config_weight_table(vace_config(m))


def init_model(m, attention=None, mesh=None, seed: int = 0):
    return vace_convert.init_model(vace_config(m), attention, mesh, seed=seed)


def condition_shapes(m, latent_shape) -> dict[str, tuple[int, ...]]:
    """``control`` on the latents' grid (module docstring)."""
    _, f, y, x = latent_shape
    return {"control": (m.vace_in_channels, f, y, x)}


def call_inputs(condition, dtype) -> dict:
    """The VACE transformer's keyword arguments from a sample's condition entries."""
    return {"control_hidden_states": condition["control"].astype(dtype)}


def forward_flops(m, tokens: int, block: float) -> float:
    """Forward matmul FLOPs the VACE branch adds to Wan's: its blocks (``block``: one main
    block's), each one's ``proj_out``, ``vace_proj_in`` and the control patch embedding."""
    D = m.inner_dim
    pt, ph, pw = m.patch_size
    n = len(m.vace_layers)
    return float(n * (block + 2 * tokens * D * D) + 2 * tokens * D * D
                 + 2 * tokens * m.vace_in_channels * pt * ph * pw * D)


def trained(m, train):
    """The ``nnx`` filter of what a run trains: with ``train.vace_trainable = "vace"`` the VACE
    branch (``vace_blocks``, ``vace_proj_in``, ``vace_patch_embedding_*``), the base frozen, as
    VACE was trained; ``"all"``: None (everything)."""
    if train.vace_trainable == "all":
        return None
    return lambda path, _: str(path[0]).startswith("vace_")


__all__ = ["call_inputs", "check", "condition_shapes", "create", "forward_flops", "init_model",
           "is_vace", "param_shardings", "trained", "weight_table"]
