"""Fixtures of the TPU group (tests/tpu: kernels, steps and videos on a real chip against
references; ``make test-tpu``, one process on a TPU machine). Its modules import ``chip``,
``host`` and ``on`` from here and mark themselves ``tpu``; without a TPU they skip, so ``make
test`` (CPU) passes over them. (A module, not a second ``conftest.py``: the suite's modules
import names from the root one as ``conftest``.)

``DITAX_TPU_TESTS=cpu`` runs the group with the CPU standing in for the chip (the Pallas
kernels in interpret mode): a check of the tests themselves, not of a chip.
"""

import os

import jax
import pytest

STAND_IN = os.environ.get("DITAX_TPU_TESTS") == "cpu"


def tpu_devices() -> list:
    """The chip's devices (the CPU's first one under ``DITAX_TPU_TESTS=cpu``); [] without."""
    if STAND_IN:
        return jax.devices("cpu")[:1]
    try:
        return [d for d in jax.devices("tpu") if d.platform == "tpu"]
    except RuntimeError:
        return []


@pytest.fixture(scope="session")
def chip():
    """The first TPU device (skip without one); arrays and programs go there explicitly."""
    devices = tpu_devices()
    if not devices:
        pytest.skip("needs a TPU: make test-tpu on a TPU machine (DITAX_TPU_TESTS=cpu runs "
                    "this group against the CPU, to check the tests)")
    return devices[0]


@pytest.fixture(scope="session")
def host():
    """The CPU device the references run on."""
    return jax.devices("cpu")[0]


def on(device, *arrays):
    """``arrays`` committed to ``device`` (a program then runs where its inputs are)."""
    out = tuple(jax.device_put(a, device) for a in arrays)
    return out if len(out) > 1 else out[0]
