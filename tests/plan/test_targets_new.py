"""The single-chip and TPU7x (Ironwood) ``--target`` names (issues 45 / 46): each parses to its
chip and libtpu topology, and libtpu describes a slice of the device count the name promises
(one device a v5e / v6e / v5p chip, two a TPU7x chip: one per TensorCore). Needs libtpu (the
TPU test group); skips with the install command without it. No compile: topologies only.
"""

import importlib.util

import pytest

from ditax.errors import RequestError
from ditax.plan.targets import CHIPS, parse_target, topology_devices, tpu_install_hint

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason=f"libtpu is not installed: {tpu_install_hint()}")

#: target -> (chip key, JAX devices in its slice, physical chips)
NEW = {"tpu-v5e-1": ("v5e", 1, 1), "tpu-v6e-1": ("v6e", 1, 1), "tpu-v5p-1": ("v5p", 1, 1),
       "tpu-v7x-2": ("v7x", 2, 1), "tpu-v7x-8": ("v7x", 8, 4), "tpu-v7x-16": ("v7x", 16, 8)}


def test_new_targets_parse_to_their_chip():
    for name, (chip, _, _) in NEW.items():
        t = parse_target(name)
        assert (t.kind, t.chip) == ("tpu", CHIPS[chip]), name
    assert parse_target("tpu-v6e-1").chips_per_host == (1, 1, 1)
    assert parse_target("tpu-v6e-8").chips_per_host is None          # libtpu's default host
    # a v7x device is one TensorCore: half of the chip's published figures
    v7x = CHIPS["v7x"]
    assert (v7x.bf16_flops, v7x.hbm_bytes) == (2307e12 / 2, 96 * 2**30)
    with pytest.raises(RequestError, match="tpu-v7x-8"):             # the choices are listed
        parse_target("tpu-v7x-4")


@needs_libtpu
def test_new_targets_give_their_device_counts():
    for name, (_, n_devices, n_chips) in NEW.items():
        devices = topology_devices(parse_target(name))
        assert len(devices) == n_devices, name
        assert len({tuple(d.coords) for d in devices}) == n_chips, name
    assert topology_devices(parse_target("tpu-v7x-8"))[0].device_kind == "TPU7x"
