"""Lowering ditax's programs for CUDA on a CPU machine: jax's cuDNN probes answered for an
H200 (sm 9.0, cuDNN 9.10) and the StableHLO of a function lowered for ``cuda``.

jax asks the local GPU for its cuDNN version and compute capability while lowering;
:func:`h200` patches those probes in jax's private module
``jax._src.cudnn.fused_attention_stablehlo`` (test code only;
``tests/attention/test_cuda_lowering.py::test_jax_cudnn_probes_are_where_we_patch_them``
fails, not skips, if jax moves them) and sets ditax's target platform to that GPU.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import jax

import ditax

FWD, BWD = "__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"
PROBES = ("cuda_versions", "check_compute_capability", "is_cuda_compute_capability_equal")


def fused_attention_module():
    from jax._src.cudnn import fused_attention_stablehlo as fa

    return fa


class _Cudnn910:
    @staticmethod
    def cudnn_get_version():
        return 91000


@contextlib.contextmanager
def h200():
    fa = fused_attention_module()
    cc = (9, 0)

    def at_least(c):
        return cc >= tuple(int(x) for x in c.split("."))

    def equal(c):
        return cc == tuple(int(x) for x in c.split("."))

    with mock.patch.object(fa, "cuda_versions", _Cudnn910), \
            mock.patch.object(fa, "check_compute_capability", at_least), \
            mock.patch.object(fa, "is_cuda_compute_capability_equal", equal), \
            ditax.target_platform("cuda", compute_capability=cc):
        yield


def cuda_hlo(fn, *args) -> str:
    """``fn(*args)`` traced and lowered for CUDA: its StableHLO text (nothing compiles)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
