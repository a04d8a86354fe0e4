"""Quiet on CPU (issue 57 item 4): with libtpu installed and no TPU attached, a ditax command
prints nothing of libtpu's chip probing; other stderr output passes through."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ditax.cli.quiet import filter_probing, quiet_libtpu

PROBE = ("Failed to find host bounds for accelerator type: WARNING: could not determine TPU "
         "accelerator type, please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise "
         "libtpu.so may not properly initialize.\n"
         "WARNING: Logging before InitGoogle() is written to STDERR\n"
         "E0000 00:00:1796527455.125863   24540 common_lib.cc:554] INVALID_ARGUMENT: Error: "
         "unexpected worker hostname 'WARNING: could not determine TPU worker hostnames' from "
         "env var TPU_WORKER_HOSTNAMES.\n"
         "=== Source Location Trace: === \n"
         "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\n")


def test_filter_drops_only_the_probing_lines():
    kept = "UserWarning: something a user should see\n"
    assert filter_probing(PROBE + kept) == kept
    assert filter_probing(PROBE) == ""


def test_the_filter_passes_partial_lines_at_once_and_drops_probing(capfd):
    """What a command writes to fd 2 comes through (a progress bar's ``\r`` line without its
    newline too); libtpu's probing lines, written from C the same way, do not."""
    with quiet_libtpu():
        os.write(2, b"step 1/4\r")
        os.write(2, PROBE.encode())
        os.write(2, b"done\n")
    err = capfd.readouterr().err
    assert err == "step 1/4\rdone\n"


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed: nothing probes for a chip")
def test_a_cpu_command_prints_no_libtpu_probing():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS",)}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    res = subprocess.run([sys.executable, "-m", "ditax.cli", "bench", "tiny", "--repeats", "1",
                          "--no-progress", "--latent", "1,8,8", "--text-len", "8"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["platform"] == "cpu"
    for needle in ("libtpu", "TPU_WORKER_HOSTNAMES", "InitGoogle", "Source Location Trace"):
        assert needle not in res.stderr, res.stderr
