"""``benchmarks/vsa_table.py`` (VSA's table fine pass against dense splash, for the chip):
its cases run on CPU at a tiny shape (kernels interpreted) without an error row, each with
its density and the table kernels' group (the chosen one, and the compared ones at the swept
densities), and its random picks are distinct key tiles per query tile."""

from __future__ import annotations

import os
import pathlib
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import vsa_table  # noqa: E402


class Rows:
    repeats = 1

    def __init__(self):
        self.rows = []

    def case(self, name, fn, args, flops, peak, **settings):
        out = jax.block_until_ready(jax.jit(fn)(*args))
        assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in jax.tree.leaves(out))
        self.rows.append(dict(case=name, flops=flops, **settings))


@pytest.mark.slow   # 9 s: every case interpreted
def test_the_cases_run_at_a_tiny_shape():
    sw = Rows()
    vsa_table.vsa_cases(sw, grid=(3, 6, 6), tile=(2, 2, 2), heads=2, head_dim=16,
                        densities=(0.5, 0.1), dense=False, interpret=True, groups=(16,))
    names = [r["case"] for r in sw.rows]
    assert len(names) == 2 * (2 + 1) + 2 * (1 + 1) + 1 and sum("gather-flash" in n for n in names) == 1
    assert {r["topk"] for r in sw.rows} == {9, 2} and all(r["tiles"] == 18 for r in sw.rows)
    fwd = [r for r in sw.rows if r["direction"] == "fwd" and r["path"] == "fine table"]
    # 9 picks: the choice (2 steps of 5), and 16 folded to all 9; 2 picks: the choice only
    assert [(r["topk"], r["group"], r["group_auto"]) for r in fwd] == [
        (9, 5, True), (9, 9, False), (2, 2, True)]
    assert [r["flops"] for r in fwd] == [4.0 * 2 * 144 * k * 8 * 16 for k in (9, 9, 2)]
    layer = [r for r in sw.rows if r["path"] == "layer table"]
    assert [(r["group"], r["group_auto"]) for r in layer] == [(5, True)] * 2 + [(2, True)] * 2


def test_random_picks_are_distinct_tiles():
    p = np.asarray(vsa_table.random_picks(jax.random.PRNGKey(3), 2, 3, 10, 4))
    assert p.shape == (2, 3, 10, 4) and p.min() >= 0 and p.max() < 10
    assert all(len(set(row)) == 4 for row in p.reshape(-1, 4))


def test_the_tile_cases_run_at_a_tiny_shape():
    """``--tiles`` (issue 58 item 1) at ``--small``'s grid: per density, the default 4 x 8 x 8
    tiles and the least-padding ones (5 x 12 x 20: 3,072 padded tokens against 1,920), each
    row naming its grid, tile and padding; a topk two densities share runs once."""
    sw = Rows()
    vsa_table.tile_cases(sw, grids=vsa_table.SMALL_GRIDS, heads=2, head_dim=16,
                         interpret=True, dense=False)
    got = [(tuple(r["tile"]), r["topk"], r["tiles"], r["tokens"], r["padding"]) for r in sw.rows]
    assert got == [((4, 8, 8), 2, 12, 3072, 1.56), ((4, 8, 8), 3, 12, 3072, 1.56),
                   ((4, 8, 8), 6, 12, 3072, 1.56), ((8, 12, 4), 1, 5, 1920, 0.6),
                   ((8, 12, 4), 2, 5, 1920, 0.6)]
    assert all(r["grid"] == [5, 12, 20] and r["path"] == "fine table" for r in sw.rows)
    assert [r["flops"] for r in sw.rows][-1] == 4.0 * 2 * 1920 * 2 * 384 * 16


def test_the_chip_parts_refuse_off_a_tpu_in_one_line():
    """``tpu_chip.py --part vsa_tiles`` on CPU: one line naming the part, the platform and the
    CPU path, before anything runs."""
    import tpu_chip

    assert tpu_chip.off_chip_refusal(["attention"]) is None
    why = tpu_chip.off_chip_refusal(["forward", "vsa_tiles"])
    assert why.startswith("tpu_chip.py --part vsa_tiles times Pallas TPU kernels") and \
        "platform here is cpu" in why and "vsa_table.py --tiles --small" in why and \
        "\n" not in why


def test_the_scoped_vmem_limit_is_raised_before_the_backend_starts(monkeypatch):
    """Session 60 on the chip: the off-TPU check started JAX's backend before
    ``raise_scoped_vmem`` ran, so splash at Wan's tiles failed to compile (scoped VMEM). The
    flag must be in ``LIBTPU_INIT_ARGS`` by the time ``off_chip_refusal`` asks for devices."""
    import tpu_chip

    from ditax.tpu_env import FLAG

    seen = []
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "")
    monkeypatch.setattr(tpu_chip, "off_chip_refusal",
                        lambda parts: seen.append(os.environ["LIBTPU_INIT_ARGS"]) or "stop")
    monkeypatch.setattr(sys, "argv", ["tpu_chip.py", "--part", "vsa"])
    with pytest.raises(SystemExit):
        tpu_chip.main()
    assert seen and FLAG in seen[0]


def test_a_mistyped_variant_is_refused_before_a_compile(capsys):
    """``--variants`` (issue 58 item 5) names the table forward's variants; a typo ends the
    script in one line that lists the flags."""
    with pytest.raises(SystemExit, match="--variants: .*unknown flag.*the flags are bias"):
        vsa_table.main(["--tiles", "--small", "--variants", "plain,bais"])
