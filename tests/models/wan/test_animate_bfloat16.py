"""The Wan 2.2 Animate transformer in bfloat16 (how the 14B model runs): the motion encoder's
scaled convs keep the input's dtype (a float32 scale once promoted its kernels, and XLA's conv
refused bfloat16 crops against float32 kernels), and the bfloat16 forward stays within bfloat16
rounding of the float32 one with the same weights."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.wan.animate import WanAnimateConfig
from ditax.models.wan.animate_convert import abstract_model
from wan_reference import rel_err

Z = 4
CFG = WanAnimateConfig(num_attention_heads=2, attention_head_dim=16, in_channels=2 * Z + 4,
                       latent_channels=Z, out_channels=Z, text_dim=32, freq_dim=32, ffn_dim=64,
                       num_layers=2, image_dim=24, added_kv_proj_dim=32,
                       motion_encoder_channel_sizes=(("16", 8), ("4", 8), ("8", 12)),
                       motion_encoder_size=16, motion_style_dim=16, motion_dim=4,
                       motion_encoder_dim=16, face_encoder_hidden_dim=8,
                       face_encoder_num_heads=2, inject_face_latents_blocks=1,
                       motion_encoder_batch_size=4)


def _random(cfg, seed=0):
    """The model of ``cfg`` with N(0, s) weights from numpy (s = 1 in the motion encoder,
    0.5 / sqrt(fan) elsewhere): the same numbers for every dtype."""
    gdef, state = nnx.split(abstract_model(cfg))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        s = 1.0 if "motion_encoder" in str(path) else 0.5 / max(1, leaf.shape[-1]) ** 0.5
        return jnp.asarray(rng.standard_normal(leaf.shape) * s, leaf.dtype)

    return nnx.merge(gdef, jax.tree_util.tree_map_with_path(draw, state))


def test_bfloat16_forward_follows_float32():
    m32 = _random(CFG)
    m16 = _random(dataclasses.replace(CFG, param_dtype="bfloat16", dtype="bfloat16"))
    rng = np.random.default_rng(0)
    a = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    f, y, x = 3, 4, 6
    inp = (a(1, 2 * Z + 4, f, y, x), np.float32([500.0]), a(1, 8, 32), a(1, 257, 24),
           a(1, Z, f - 1, y, x), np.tanh(a(1, 3, 4 * (f - 2) + 1, 16, 16)))

    def run(m, dt):
        lat, t, text, image, pose, face = (jnp.asarray(v).astype(dt) for v in inp)
        fwd = nnx.jit(lambda m, *a: m(*a[:3], None, a[3], pose_hidden_states=a[4],
                                      face_pixel_values=a[5]))
        return fwd(m, lat, t.astype(jnp.float32), text, image, pose, face)

    want = run(m32, jnp.float32)
    got = run(m16, jnp.bfloat16)
    assert got.dtype == jnp.bfloat16
    err = rel_err(np.asarray(got, np.float32), np.asarray(want))
    print(f"animate bfloat16 vs float32: rel err {err:.2e}")
    assert err < 5e-2, err
    face = jax.eval_shape(nnx.jit(lambda m, c: m.face_tokens(c)), m16,
                          jax.ShapeDtypeStruct(inp[5].shape, jnp.bfloat16))
    assert face.dtype == jnp.bfloat16
