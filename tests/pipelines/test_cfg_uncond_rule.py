"""The CFG branches with a family's unconditional rule (``inputs.uncond``; Wan Animate's is the
blank face): the unconditional row gets the rule's extras, the conditional row the family's
own; the batched (one batch-2 forward) and sequential loops give the same pair; without a rule
both rows take the same extras."""

import jax.numpy as jnp
import numpy as np

from ditax.pipelines.denoise import cfg_branches, uncond_rule
from ditax.pipelines.wan.animate_inputs import animate_inputs, blank_face


def forward(x, tb, text, extras, rows, carry):
    """A stand-in denoiser: its output reads the latents, the text and the face extra."""
    face = extras["face_pixel_values"].reshape(x.shape[0], -1).sum(1)
    return x * text[:, 0, :1] + face[:, None], carry


def test_uncond_rule_reaches_the_unconditional_row_only():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, 3)), jnp.float32)
    face = jnp.asarray(rng.uniform(-1, 1, (1, 3, 5, 4, 4)), jnp.float32)
    text = jnp.asarray(rng.standard_normal((2, 2, 2)), jnp.float32)
    step_in = (x, jnp.zeros((1,)), {"face_pixel_values": face, "other": None})
    assert uncond_rule(animate_inputs) is blank_face
    got = {m: cfg_branches(forward, m, step_in, text, uncond=blank_face)[:2]
           for m in ("batched", "sequential")}
    blank = -1.0 * face.size
    for cond, uncond in got.values():
        np.testing.assert_allclose(cond, x * text[0, 0, 0] + face.sum(), rtol=1e-6)
        np.testing.assert_allclose(uncond, x * text[1, 0, 0] + blank, rtol=1e-6)
    np.testing.assert_array_equal(got["batched"][1], got["sequential"][1])
    same = cfg_branches(forward, "batched", step_in, text)[1]    # no rule: the same extras
    np.testing.assert_allclose(same, x * text[1, 0, 0] + face.sum(), rtol=1e-6)
