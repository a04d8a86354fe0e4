"""A tiny Wan transformer with 8-bit attention (``sage``: the Pallas kernel, interpreted on
CPU, for self- and cross-attention) against the same weights with ``xla`` attention."""

import jax
import numpy as np
from flax import nnx

from ditax.attention.config import AttentionConfig
from ditax.models.wan.build import abstract_model
from ditax.models.wan.config import WanConfig

CFG = WanConfig(num_attention_heads=2, attention_head_dim=64, ffn_dim=64, num_layers=1,
                in_channels=4, out_channels=4, text_dim=32, freq_dim=32)


def test_wan_with_sage_attention_within_2e2_of_xla(rng):
    """2 heads of 64, 1 layer, 40 video tokens, 7 text tokens: relative error (Frobenius)
    of the output <= 2e-2 (and not 0: the 8-bit path ran); the plan reads head-major (the
    kernel takes ``[B, N, L, K]`` as the projections write it)."""
    lat = rng.standard_normal((1, 4, 2, 8, 10)).astype(np.float32)
    t = np.asarray([500.0], np.float32)
    text = rng.standard_normal((1, 7, 32)).astype(np.float32)
    out, weights = {}, None
    for backend in ("xla", "sage"):
        model = abstract_model(CFG, AttentionConfig(backend=backend))
        gdef, shapes = nnx.split(model)
        if weights is None:      # random parameters (every variable is a Param), no init jit
            weights = jax.tree.map(
                lambda a: (0.1 * rng.standard_normal(a.shape)).astype(np.float32), shapes)
        out[backend] = np.asarray(jax.jit(lambda s: nnx.merge(gdef, s)(lat, t, text))(weights))
    assert model.attention_plan.self_attn.reads_head_major
    err = np.linalg.norm(out["sage"] - out["xla"]) / np.linalg.norm(out["xla"])
    assert 0 < err <= 2e-2, err
