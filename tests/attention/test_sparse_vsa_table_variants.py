"""The VSA table forward kernel's opt-in variants (issue 58 item 5,
:mod:`ditax.attention.kernels.vsa_variant`), interpreted on CPU: each gives the plain kernel's
output and log-sum-exp on fresh random inputs (key mask on, groups whose last step is padded,
row slices forced small enough to run several), the whole fine pass under a variant equals
the gather path in values and gradients (the backward takes the variant's lse), names parse
and unknown ones are refused in one line; and the static-schedule script's bookkeeping
(``benchmarks/vsa_table_llo.py``) counts a grid loop's regions and rolled loops right on a
hand-written bundle dump."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.kernels import vsa_variant
from ditax.attention.kernels.vsa_table import table_forward
from ditax.attention.kernels.vsa_variant import TableVariant
from ditax.attention.sparse.tiles import TileOrder
from ditax.attention.sparse.vsa import coarse, fine
from ditax.attention.sparse.vsa_table import fine_table

SLOW = pytest.mark.slow
VARIANTS = ("bias", "rows", "rows+pertile", "all", pytest.param("lanes", marks=SLOW),
            pytest.param("prescale", marks=SLOW), pytest.param("pv_f32", marks=SLOW),
            pytest.param("pertile", marks=SLOW), pytest.param("bias+lanes+prescale", marks=SLOW))


def _table_inputs(rng, b=1, n=2, tiles=5, t=64, k=16, topk=4):
    q, kk, v = (jnp.asarray(rng.standard_normal((b, n, tiles * t, k)), jnp.float32)
                for _ in range(3))
    keep = jnp.asarray(rng.random((b, tiles, 1, t)) > 0.3, jnp.int32)
    keep = keep.at[:, 0].set(0)                    # a key tile with every key masked
    picks = jnp.asarray(np.argsort(rng.random((b, n, tiles, tiles)), -1)[..., :topk],
                        jnp.int32)
    return q, kk, v, keep, picks


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_gives_the_plain_kernels_output_and_lse(variant, rng, monkeypatch):
    """64-token tiles, 4 of 5 picked, groups 1 and 3 (the last step padded); a score budget
    of one vreg forces ``rows`` into slices of 8 / 16 rows (several a step)."""
    monkeypatch.setattr(vsa_variant, "SCORE_VREGS", 1)
    q, k, v, keep, picks = _table_inputs(rng)
    vt = TableVariant.parse(variant)
    if vt.rows:
        assert vt.row_block(64, 3) < 64 and vt.row_block(64, 1) < 64
    for group in (1, 3):
        o0, lse0 = table_forward(q, k, v, keep, picks, scale=0.25, interpret=True,
                                 group=group)
        o, lse = table_forward(q, k, v, keep, picks, scale=0.25, interpret=True, group=group,
                               variant=variant)
        np.testing.assert_allclose(np.asarray(o), np.asarray(o0), rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(np.asarray(lse), np.asarray(lse0), rtol=2e-5, atol=2e-6)


def test_the_fine_pass_under_a_variant_equals_the_gather(rng, monkeypatch):
    """Padded 2 x 2 x 2 tiles of a 3 x 3 x 5 grid (K = 128: packed), 5 picks in groups of 2:
    ``all`` (rows sliced) against the jnp gather path, values and q / k / v gradients."""
    monkeypatch.setattr(vsa_variant, "SCORE_VREGS", 1)
    order = TileOrder((3, 3, 5), (2, 2, 2))
    t = order.tile_len
    shape = (2, order.length, 2, 128)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(3))
    mask = jnp.broadcast_to(jnp.asarray(order.valid), (2, order.length))
    _, picks = coarse(q, k, v, t, 5, mask)
    cot = jnp.asarray(rng.standard_normal(shape), jnp.float32)

    def run(fn):
        loss = lambda *a: jnp.sum(fn(*a) * cot)                      # noqa: E731
        return jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums=(0, 1, 2))(*a)))(q, k, v)

    got = run(lambda q, k, v: fine_table(q, k, v, picks, t, mask, interpret=True, group=2,
                                         variant="all"))
    want = run(lambda q, k, v: fine(q, k, v, picks, t, mask))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


def test_names_parse_and_unknown_flags_are_refused():
    assert TableVariant.parse("plain") == TableVariant() == vsa_variant.PLAIN
    assert TableVariant.parse("all").name == "bias+rows+pertile+lanes+prescale+pv_f32"
    vt = TableVariant.parse("prescale+bias")
    assert vt.bias and vt.soft.prescale and vt.name == "bias+prescale"
    assert TableVariant.parse(vt) is vt
    for bad in ("unroll", "bias+fast"):
        with pytest.raises(ValueError, match="unknown flag.*the flags are bias"):
            TableVariant.parse(bad)
    # Wan 480p's 384-token tiles: 4 tiles' scores in 48 vregs take 32 rows, one tile's 128
    assert TableVariant.parse("rows").row_block(384, 4) == 32
    assert TableVariant.parse("rows+pertile").row_block(384, 4) == 128
    assert TableVariant.parse("bias").row_block(384, 4) == 384


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))


def test_the_static_schedule_counts_regions_and_loops(tmp_path):
    """A hand-written dump of a grid loop (3 steps): straight code, an init region, the full
    fold (a rolled loop of 2 bundles, 4 trips), the last step's fold with the finish."""
    import vsa_table_llo as llo

    lines = ["  0x0   :  { %1 = smov 0 }",
             "  0x1 LB: > { %2 = sadd.s32 1, %s1 }",
             "  0x2   : > { %3 = sbr.rel (%p1) target = $region5 }",
             "  0x3   : > { %4 = vst [vmem:[#a]] %v1 }",
             ] + [f"  0x{4 + i:x}   : > {{ %{5 + i} = vst [vmem:[#a]] %v1 }}" for i in range(8)] + [
             "  0xc PF: > { %20 = smov 1 } /* Start/End empty region 5 */",
             "  0xd   : > { %21 = sbr.rel (%p2) target = $region6 }",
             "  0xe LB: >> { %22 = vmatmul.bf16.gmra.mxu0 %v2 }",
             "  0xf   : >> { %23 = vmax.f32 %v2, %v3 }",
             "  0x10 PF: > { %24 = smov 2 } /* Start/End empty region 6 */",
             "  0x11   : > { %25 = sbr.rel (%p3) target = $region7 }",
             "  0x12   : > { %26 = vmatmul.bf16.gmra.mxu1 %v2 }",
             "  0x13   : > { %27 = vlog2.f32 %v4 }",
             "  0x14 PF: > { %28 = dma.done.wait [#b], 16 } /* Start/End empty region 7 */",
             "  0x15   :  { %29 = shalt }"]
    path = tmp_path / "k-final_bundles.txt"
    path.write_text("\n".join(lines) + "\n")
    rows = llo.parse(str(path))
    runs = llo.runs_per_query_tile(rows, steps=3, trips=[4])
    # straight code 3 x; init (9 stores) once; full fold 2 steps x 4 trips; last fold once
    assert runs == [0, 3, 3] + [1] * 9 + [3, 3, 8, 8, 3, 3, 1, 1, 3, 0]
    stats = llo.query_tile_stats(str(path), steps=3, picks=3, trips=[4])
    assert stats["per_query_tile"] == sum(runs)
    assert stats["ops_per_tile"]["mxu_push"] == round((8 + 1) / 3, 1)
