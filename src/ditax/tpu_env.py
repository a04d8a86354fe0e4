"""The TPU compiler's scoped-VMEM limit: read from ``LIBTPU_INIT_ARGS`` and raised by entry
points before JAX starts its TPU backend. Imports nothing heavy (the CLI calls it before
``--help`` is parsed, and ``--help`` must not start JAX).

Why: a Pallas kernel may use only the compiler's *scoped* part of a TPU core's VMEM (16 MiB by
default on v5e, 32 MiB on v6e, of 128 MiB), unless it passes a limit of its own. ditax's
``flash`` kernels do; JAX's splash kernel does not, and its fastest tiles need more
(:mod:`ditax.attention.tuning`). The flag applies to the whole process, and only when set
before the TPU backend starts, so it is set at the entry point, visibly, and never by a
library call.
"""

from __future__ import annotations

import os
import re
from typing import Optional

#: scoped VMEM the compiler allows a kernel without a limit of its own, per TPU generation
DEFAULT_SCOPED_MIB = {"v4": 16, "v5e": 16, "v5p": 16, "v6e": 32, "v7x": 32}
#: the scoped limit ditax commands ask for, per generation
RAISED_SCOPED_MIB = {"v5e": 96, "v6e": 96}
FLAG = "--xla_tpu_scoped_vmem_limit_kib"


def scoped_vmem_mib(gen: Optional[str], env: Optional[str] = None) -> int:
    """The compiler's scoped-VMEM limit in this process (MiB): ``LIBTPU_INIT_ARGS``'s
    ``--xla_tpu_scoped_vmem_limit_kib`` when set (``env``: that string instead), else the
    generation's default."""
    args = os.environ.get("LIBTPU_INIT_ARGS", "") if env is None else env
    m = re.search(FLAG + r"=(\d+)", args)
    if m:
        return int(m.group(1)) // 1024
    return DEFAULT_SCOPED_MIB.get(gen, 16)


def raise_scoped_vmem() -> Optional[str]:
    """For entry points, before JAX starts its TPU backend: add the raised scoped-VMEM limit
    to ``LIBTPU_INIT_ARGS`` unless the user set one. Returns the flag added (None: a limit
    was set already). The generation is not known before the backend starts, so the flag is
    the one every generation in :data:`RAISED_SCOPED_MIB` takes; on other platforms nothing
    reads it."""
    args = os.environ.get("LIBTPU_INIT_ARGS", "")
    if FLAG in args:
        return None
    flag = f"{FLAG}={min(RAISED_SCOPED_MIB.values()) * 1024}"
    os.environ["LIBTPU_INIT_ARGS"] = (args + " " + flag).strip()
    return flag


__all__ = ["DEFAULT_SCOPED_MIB", "RAISED_SCOPED_MIB", "scoped_vmem_mib", "raise_scoped_vmem"]
