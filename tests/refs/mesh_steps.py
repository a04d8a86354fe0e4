"""One training step run two ways (on a mesh and on one device) compared through what it
stores: the loss, and each part of the state within a fraction of how far the step moved it."""

import jax
import numpy as np


def assert_same_step(state, got, got_metrics, want, want_metrics,
                     parts=("params", "fake"), loss_tol: float = 1e-5, rel: float = 1e-3):
    """``got`` and ``want`` (states after one step from ``state``, host or device arrays)
    agree: losses within ``loss_tol``; in each of ``parts`` the largest difference at most
    ``rel`` times the largest change the step made (which must not be zero)."""
    assert abs(float(got_metrics["loss"]) - float(want_metrics["loss"])) < loss_tol
    for part in parts:
        err = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                           got[part], want[part])
        moved = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))),
                             got[part], state[part])
        err, moved = max(jax.tree.leaves(err)), max(jax.tree.leaves(moved))
        assert moved > 0 and err <= rel * moved, (part, err, moved)
