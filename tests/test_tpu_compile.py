"""ditax's TPU program compiled for real TPUs without one (issue 11): a v6e topology from libtpu
(``jax.experimental.topologies``), a mesh over its 8 devices, and ``jit(...).lower().compile()``
giving the TPU executable with its Mosaic kernels (``tpu_custom_call``) in the HLO.

Covered: splash; Ulysses flat / chunked / shard_major and ring with local=flash at an awkward
length (L=405) on context 8 and on fsdp 2 x context 4, forward and gradients; shard_major's
relayout copies below flat's; one Wan layer through ``ditax plan --target tpu-v6e-8``. The
block-size defaults (TPU 512, config-tunable, clipped) need no libtpu. Skips with the install
command when libtpu is missing; ``make test`` installs it (the ``[tpu]`` extra).
"""

import dataclasses
import importlib.util
import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import ditax
from ditax.attention import attend
from ditax.attention.config import AttentionConfig
from ditax.attention.plan import plan_attention, resolve
from ditax.attention.sequence import plan_sequence_parallel
from ditax.cli import main
from ditax.parallel import make_mesh
from ditax.plan.audit import KERNEL_TARGET, audit

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f'libtpu is not installed: pip install "jax[tpu]=={jax.__version__}" '
           f'(deviceless TPU compile)')

L, N, K = 405, 8, 128          # 405 tokens: shards of 51 / 102, blocks of 56 / 104 (not 128s)


# ---------------------------------------------------------------- block sizes (no libtpu)


def test_tpu_default_blocks_are_512_tunable_and_clipped():
    mesh = make_mesh({"context": 8})
    acfg = AttentionConfig(backend="ulysses", local="flash")
    assert plan_attention(acfg, mesh).self_attn.options.block_q == 128     # CPU: unchanged
    with ditax.target_platform("tpu"):
        opts = plan_attention(acfg, mesh).self_attn.options
        assert (opts.block_q, opts.block_kv) == (512, 512)
        tuned = plan_attention(dataclasses.replace(acfg, block_q=1024), mesh).self_attn.options
        assert (tuned.block_q, tuned.block_kv) == (1024, 512)
        assert resolve("flash", {}).options.block_q == 512
        assert resolve("flash", {"block_kv": 64}).options.block_kv == 64
        assert resolve("blockwise", {}).options.block_kv == 512
        sp = plan_sequence_parallel("ulysses", mesh, q_shape=(1, L, N, K), dtype=jnp.bfloat16,
                                    options=opts)
        assert (sp.block_q, sp.block_kv, sp.shard_length) == (56, 56, 56)   # 51 -> 56
