"""How close a float32 training step came to its float64 truth (:mod:`f64_eval`): the bound
the chip tests (tests/tpu/test_chip_steps.py) hold a chip's step to, and its checks on the CPU
(tests/train/test_step_truth.py).

A step is compared through what it stores: each optimiser's first moment (Adam's ``mu``:
after one step ``(1 - b1)·g``, the gradient rounded once; after a DMD2 step's two critic
updates a sum of two) and the parameters' update. The update alone says little: ~1e-5 a
weight (learning rate 0.01) stored into weights of ~0.2 keeps only what float32's spacing
there allows, so any float32 step's update is ~3.9e-4 (relative, whole tree) from the exact
one, the truth's own update rounded into float32 moving as much; where the gradients of two
steps differ, their updates differ within that rounding. The gradient is where a platform's
arithmetic shows. Measured on the CPU (relative to the truth's norm):

================================  =========  ===========  =========
step (tiny Wan, batch of 2)       CPU f32    1-unit f32   bfloat16
================================  =========  ===========  =========
flow matching: gradient           4.0e-6     1.6e-5       7.4e-3
flow matching: update             3.9e-4     7.1e-4       7.4e-3
DMD2 student: gradient            3.9e-6     9.3e-6       8.4e-3
DMD2 student: update              3.9e-4     7.1e-4       8.4e-3
DMD2 critic (2 updates): grad.    9.0e-6     1.3e-5       1.0e-2
DMD2 critic (2 updates): update   4.1e-4     7.5e-4       1.0e-2
================================  =========  ===========  =========

"1-unit f32": every arithmetic result off by a full float32 rounding unit
(:func:`f64_eval.run_jittered`: what another platform's ``exp``, division or summation order
may do, and more, as it also moves the correctly rounded ``p + u``); "bfloat16": the
``model.dtype=bfloat16`` step (a bfloat16 matmul's error).
"""

import jax
import numpy as np

#: a chip's gradient may be this many times as far from the truth as the CPU's: one
#: rounding unit of error in every op lands up to 4.0× as far (the table above; 4.2× with
#: the 24-sample dataset's batch); 8 is twice that, and a bfloat16 matmul is ~2000× as far
GRAD_FACTOR = 8.0
#: a chip's update may be this many times as far from the truth's as the CPU's: the 1-unit
#: float32 step lands up to 1.8× as far (the table; that model also moves the final
#: ``p + u``, which any IEEE add rounds alike: without it 1.03×), a bfloat16 one 19× or more
UPDATE_FACTOR = 2.0


def moments(opt_state) -> list:
    """The first-moment leaves (``…mu…``) of an optax state, as float64 numpy."""
    return [np.asarray(x, np.float64) for p, x in jax.tree_util.tree_flatten_with_path(opt_state)[0]
            if ".mu" in jax.tree_util.keystr(p)]


def _leaves(tree) -> list:
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


def distance(a: list, b: list) -> float:
    """``||a - b||`` over lists of arrays."""
    return float(np.sqrt(sum(np.sum((x - y) ** 2) for x, y in zip(a, b))))


def norm(a: list) -> float:
    return float(np.sqrt(sum(np.sum(x ** 2) for x in a)))


def step_errors(run: dict, truth: dict, init: dict, part: str, opt: str) -> dict:
    """``run``'s distances from ``truth`` (states after one step from ``init``'s parameters
    ``part``, optimiser state ``opt``), relative to the truth's gradient and update: ``grad``
    (first moments), ``update`` (parameters) and ``rounding`` (the truth's parameters rounded
    to float32: what storing the exact update in float32 moves)."""
    g, g64 = moments(run[opt]), moments(truth[opt])
    p, p64, p0 = _leaves(run[part]), _leaves(truth[part]), _leaves(init[part])
    fl = [x.astype(np.float32).astype(np.float64) for x in p64]
    u = norm([x - y for x, y in zip(p64, p0)])
    return {"grad": distance(g, g64) / norm(g64), "update": distance(p, p64) / u,
            "rounding": distance(fl, p64) / u}


def check_step(run: dict, cpu: dict, truth: dict, init: dict, part: str, opt: str) -> dict:
    """Assert that ``run`` (a chip's step) made the step ``cpu`` (the CPU's float32 step)
    made, against ``truth`` (its float64 evaluation): the gradient within :data:`GRAD_FACTOR`
    times the CPU's distance from the truth, the update within :data:`UPDATE_FACTOR` times
    the CPU's, each plus one float32 rounding unit (6e-8: a CPU exact by chance asks no more
    than float32 has). The errors of both (for a report)."""
    e, c = step_errors(run, truth, init, part, opt), step_errors(cpu, truth, init, part, opt)
    unit = np.finfo(np.float32).eps / 2
    assert e["grad"] <= GRAD_FACTOR * c["grad"] + unit, (part, "gradient", e, c)
    assert e["update"] <= UPDATE_FACTOR * c["update"] + unit, (part, "update", e, c)
    return {"run": e, "cpu": c}
