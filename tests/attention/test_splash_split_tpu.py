"""The split splash forward (:mod:`ditax.attention.splash_split`) at Wan 2.1 1.3B's 480p
shape compiles for a TPU v5e (deviceless) with the table's tiles, within the scoped VMEM
ditax commands raise. Its own module: the two kernels' Mosaic compiles take 18 s (idle) to
60 s (loaded) on a 2-core host, and the split's CPU tests (test_splash_split.py) stay short."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax
from ditax.attention.splash import splash_attention

# ---------------------------------------------------------------- deviceless TPU v5e compile

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu is not installed: pip install "jax[tpu]==0.10.2" (deviceless TPU compile)')


@needs_libtpu
@pytest.mark.slow
def test_wan_480p_split_compiles_for_v5e_within_scoped_vmem():
    """Wan 2.1 1.3B at 480x832x81 (32,760 tokens, 12 heads x 128, bf16) with the v5e table's
    raised-limit tiles (2048 / 4096 / 1024) under the 96 MiB scoped limit ditax commands
    set: the forward is two Mosaic kernels (28,672 keys unmasked + 4,088 masked) and both
    fit."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    from ditax.tpu_env import FLAG, RAISED_SCOPED_MIB

    dev = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1",
                                       chips_per_host_bounds=(1, 1, 1)).devices[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    x = jax.ShapeDtypeStruct((1, 32760, 12, 128), jnp.bfloat16, sharding=rep)
    limit = {FLAG.lstrip("-"): str(RAISED_SCOPED_MIB["v5e"] * 1024)}
    with ditax.target_platform("tpu"):
        fn = jax.jit(lambda q, k, v: splash_attention(
            q, k, v, block_q=2048, block_kv=4096, block_kv_compute=1024, block_q_bwd=1024,
            block_kv_bwd=1024, interpret=False))
        hlo = fn.lower(x, x, x).compile(compiler_options=limit).as_text()
    assert hlo.count('custom_call_target="tpu_custom_call"') == 2
