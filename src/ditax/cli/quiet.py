"""Start JAX's backends without libtpu's probing noise on a machine with no TPU.

With libtpu installed (``make test`` installs it for the deviceless TPU compiles) and no TPU
attached, JAX's first ``jax.devices()`` loads the TPU plugin, which asks for the chip and
prints five lines to the process's stderr from C++ ("could not determine TPU accelerator
type", "Logging before InitGoogle()", "E0000 ... unexpected worker hostname ...", a source
trace) before JAX falls back to the CPU. Nothing is wrong, but every command started with
them. :func:`start_backends` starts the backends once, with file descriptor 2 caught: when
the devices it finds are not TPUs those probing lines are dropped (anything else caught is
printed as it was); on a TPU, or when starting failed, everything caught is printed. The
backends, the platform JAX chooses and every later message are unchanged.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

#: lines libtpu prints while probing for a chip that is not there
PROBING = re.compile(
    r"(could not determine TPU|Failed to find host bounds|Logging before InitGoogle|"
    r"TPU_WORKER_HOSTNAMES|unexpected worker hostname|=== Source Location Trace|"
    r"libtpu_init_utils|TPU_ACCELERATOR_TYPE|libtpu\.so may not properly initialize)")


def filter_probing(text: str) -> str:
    """``text`` without libtpu's chip-probing lines."""
    return "".join(line for line in text.splitlines(keepends=True) if not PROBING.search(line))


def start_backends() -> list:
    """``jax.devices()``, started with stderr caught as the module docstring says. Returns
    the devices (an empty list when no backend could start; the caught text is then printed
    whole and JAX's own error comes again at first use)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devices: list = []
    ok = False
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import jax

            devices = jax.devices()
            ok = True
        except Exception:   # noqa: BLE001 — reported by JAX again where the command uses it
            devices = []
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        text = caught.read().decode("utf-8", "replace")
    on_tpu = any(getattr(d, "platform", "") == "tpu" for d in devices)
    if text:
        sys.stderr.write(text if (on_tpu or not ok) else filter_probing(text))
        sys.stderr.flush()
    return devices


__all__ = ["start_backends", "filter_probing", "PROBING"]
