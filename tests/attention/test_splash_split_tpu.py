"""The padded-keys splash forwards at Wan 2.1 1.3B's 480p shape compile for a TPU v5e
(deviceless) with the table's tiles, within the scoped VMEM ditax commands raise: the split
(:mod:`ditax.attention.splash_split`) and the copied keys
(:mod:`ditax.attention.splash_duplicate`). Their own module: the Mosaic compiles take 18 s
(idle) to 60 s (loaded) a program on a 2-core host, and the CPU tests stay short."""

import importlib.util
import os
import re

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


def _compile_v5e(padded_keys: str) -> str:
    """The compiled v5e program (HLO text) of splash at Wan 2.1 1.3B 480p (32,760 tokens,
    12 heads x 128, bf16) with the v5e table's raised-limit tiles (2048 / 4096 / 1024) under
    the 96 MiB scoped limit ditax commands set."""
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
            block_kv_bwd=1024, interpret=False, padded_keys=padded_keys))
        return fn.lower(x, x, x).compile(compiler_options=limit).as_text()


def _float32_passes(hlo: str) -> list[str]:
    """The fusions of the entry computation that write a float32 array as large as the
    attention output (12 x 32,768 x 128 or more): an extra pass over o in float32."""
    entry = hlo[hlo.index("\nENTRY"):]
    big = []
    for m in re.finditer(r"%(\S+) = f32\[([\d,]+)\]\S* fusion\(", entry):
        if np.prod([int(d) for d in m.group(2).split(",")]) >= 12 * 32760 * 128:
            big.append(m.group(1))
    return big


@needs_libtpu
@pytest.mark.slow
def test_wan_480p_split_compiles_for_v5e_within_scoped_vmem():
    """The split (padded_keys="split"): two Mosaic kernels (28,672 keys unmasked + 4,088
    masked), both fit."""
    hlo = _compile_v5e("split")
    assert hlo.count('custom_call_target="tpu_custom_call"') == 2


@needs_libtpu
@pytest.mark.slow
def test_wan_480p_copied_keys_compile_to_one_unmasked_kernel_for_v5e():
    """The copies (``padded_keys="auto"`` at this shape): ONE unsegmented kernel over 32,768
    keys that fits, and the correction around it writes no float32 copy of the output (it
    reads o in bf16 in one pass)."""
    hlo = _compile_v5e("auto")
    assert hlo.count('custom_call_target="tpu_custom_call"') == 1
    assert "splash_mha_fwd_residuals" in hlo and "segmented" not in hlo
    assert _float32_passes(hlo) == []
