"""8-bit attention as the local kernel of the sequence-parallel backends, on 8 CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np

from ditax.attention import attend
from ditax.attention.sage import sage_xla_attention
from ditax.parallel.mesh import make_mesh
from sage_inputs import exact, frob, realistic


def test_sage_xla_in_ulysses_and_ring_on_8_devices(rng):
    """ulysses(local=sage_xla) on context=8 equals sage_xla on one device (each device holds
    whole sequences of its heads: the same blocks, means and scales); ulysses_ring (U = 4,
    R = 2) quantizes each ring step's K chunk with its own mean and merges the steps by the
    true-score lse: within the 8-bit error of float32 attention."""
    B, L, N, K = 1, 128, 8, 32
    q, k, v = realistic(rng, B, L, L, N, K, jnp.float32)
    mask = jnp.asarray(np.arange(L)[None] < 120)
    mesh = make_mesh({"context": 8})
    kw = dict(kv_mask=mask, block_q=32, block_kv=32)
    par = lambda backend, **o: attend(q, k, v, backend=backend, mesh=mesh,   # noqa: E731
                                      local="sage_xla", **kw, **o)
    one, uly, ring = jax.jit(lambda: (sage_xla_attention(q, k, v, **kw), par("ulysses"),
                                      par("ulysses_ring", ulysses_shards=4)))()
    np.testing.assert_allclose(uly, one, rtol=1e-5, atol=1e-5)
    ref = exact(q, k, v, mask)[0]
    assert frob(ring, ref) <= 1e-2 and not np.allclose(ring, one, rtol=1e-6, atol=1e-6)
    assert frob(one, ref) <= 1e-2
