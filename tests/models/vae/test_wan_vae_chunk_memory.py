"""The Wan VAE decode's automatic chunk length on the TPU fast path: scaled with the frame's
pixels and kept within a device's memory by ``WanVAE.chunk_memory``'s estimate of a later
chunk's program, which matches what deviceless TPU v5e compiles of the full-size Wan 2.1
decoder said (``docs/vae_decode_memory_v5e.jsonl``, from ``benchmarks/vae_decode.py
--memory tpu-v5e-1``); the chunking it picks under a small budget decodes the same frames."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.models.vae.wan import WanVAE, WanVAEConfig, chunks
from ditax.models.vae.wan.chunks import chunk_frames, decode_chunk, memory_budget
from shared_inputs import randomise

RECORD = pathlib.Path(__file__).resolve().parents[3] / "docs" / "vae_decode_memory_v5e.jsonl"
V5E = int(15.75 * 2**30)              # a TPU v5e's bytes_limit
BUDGET = int(chunks.MEMORY_FRACTION * V5E)
SIZES = {"480x832": (60, 104), "720x1280": (90, 160)}


def _first_cache(vae, y: int, x: int):
    """The feature cache after the first latent frame (shapes only; the fast path's, padded)."""
    graphdef, state = nnx.split(vae)
    z = jax.ShapeDtypeStruct((1, 1, y, x, vae.z_dim), vae.dtype)
    return jax.eval_shape(lambda s, z: decode_chunk(graphdef, s, z, None, first=True,
                                                     path="interpret"), state, z)[1]


@pytest.fixture(scope="module")
def wan21():
    """The full-size Wan 2.1 VAE (shapes only) and its first caches, per dtype and size (the
    float32 module's: the bf16 one's shapes in float32)."""
    out = {}
    for dtype in ("bfloat16", "float32"):
        vae = nnx.eval_shape(lambda: WanVAE(WanVAEConfig(), dtype=jnp.dtype(dtype),
                                            rngs=nnx.Rngs(0)))
        if dtype == "bfloat16":
            caches = {k: _first_cache(vae, *yx) for k, yx in SIZES.items()}
        else:
            caches = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32), caches)
        out[dtype] = vae, caches
    return out


def _choose(vae, cache, y: int, x: int, budget: int):
    memory = vae.chunk_memory((1, 21, y, x, vae.z_dim), cache)
    return chunk_frames(20, y * x * 64, True, None, memory, budget), memory


def test_720p_chunks_are_shorter_and_fit_a_v5e(wan21):
    """81 frames in bf16 under 80% of a v5e: 480p keeps 4 latent frames a chunk (its chunking
    before the budget), 720p takes fewer; each chosen chunk's estimate is within the budget."""
    vae, caches = wan21["bfloat16"]
    chosen = {k: _choose(vae, caches[k], *SIZES[k], BUDGET) for k in SIZES}
    assert chosen["480x832"][0] == 4 and chosen["720x1280"][0] < 4
    for n, memory in chosen.values():
        assert memory.bytes(n) <= BUDGET
    # the cache alone: 5.2 GiB at 720p, in proportion to the pixels
    cache = {k: chunks.nbytes(c) for k, c in caches.items()}
    assert 5.0 * 2**30 < cache["720x1280"] < 5.4 * 2**30
    assert cache["720x1280"] / cache["480x832"] == pytest.approx(90 * 160 / (60 * 104), rel=1e-3)


def test_float32_chunks_are_bounded_by_the_budget(wan21, caplog):
    """In float32 the pixels alone would give 480p 4 latent frames a chunk (~17 GiB): the
    budget gives it the most that fit; 720p cannot fit even one (the deviceless compile runs
    out of HBM too), decodes one at a time and warns."""
    vae, caches = wan21["float32"]
    n, memory = _choose(vae, caches["480x832"], 60, 104, BUDGET)
    assert 1 <= n < 4 and memory.bytes(n) <= BUDGET < memory.bytes(n + 1)
    assert "over the" not in caplog.text
    n, memory = _choose(vae, caches["720x1280"], 90, 160, BUDGET)
    assert n == 1 and memory.bytes(1) > BUDGET
    assert "one latent frame needs about" in caplog.text   # warned: it may not fit
    assert _choose(vae, caches["480x832"], 60, 104, 10 * V5E)[0] == 4   # a large device


def test_estimate_matches_the_deviceless_compiles(wan21):
    """Every recorded later-chunk program: the estimate, less the decoded video that lives
    beside the program (81 frames), is its peak (arguments + temporaries + outputs - the donated
    cache) to within a few percent, and not under it by more than 1%."""
    rows = [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]
    rest = [r for r in rows if r.get("program") == "rest" and "peak_bytes" in r]
    assert {r["case"].split()[0] for r in rest} >= {"480x832x81", "720x1280x81"}
    for r in rest:
        res, dtype = r["case"].split()
        vae, caches = wan21[dtype]
        key = res.rsplit("x", 1)[0]
        memory = vae.chunk_memory((1, 21, *SIZES[key], vae.z_dim), caches[key])
        video = 81 * SIZES[key][0] * SIZES[key][1] * 64 * 3 * vae.dtype.itemsize
        estimate = memory.bytes(r["frames_per_chunk"]) - video
        assert 0.99 * r["peak_bytes"] <= estimate <= 1.03 * r["peak_bytes"], r


def test_memory_budget_reads_the_device():
    assert memory_budget(jax.devices()[0]) == int(0.8 * chunks.DEFAULT_MEMORY_BYTES)  # CPU

    class Chip:   # what a TPU's jax device reports
        def memory_stats(self):
            return {"bytes_limit": 32 * 2**30, "bytes_in_use": 0}

    assert memory_budget(Chip()) == int(0.8 * 32 * 2**30)


PADDED = WanVAEConfig(base_dim=96, z_dim=4, dim_mult=(1, 1, 1, 1), num_res_blocks=1,
                      temperal_downsample=(False, True, True))


def test_budgeted_chunks_decode_the_same_frames(monkeypatch):
    """A device small enough that 3 of 5 later latent frames fit a chunk: the compiled
    programs take 3 a chunk (3, then 2 and 1 padding), and they (the fast path, interpreted)
    decode the one-latent-frame stream's frames."""
    vae = randomise(WanVAE(PADDED, rngs=nnx.Rngs(0)), 2)
    z = jax.random.normal(jax.random.key(1), (1, 4, 6, 2, 2), jnp.float32)
    memory = vae.chunk_memory((1, 6, 2, 2, 4), _first_cache(vae, 2, 2))
    limit = (memory.fixed + 3.5 * memory.per_frame) / chunks.MEMORY_FRACTION
    monkeypatch.setattr(chunks, "DEFAULT_MEMORY_BYTES", int(limit))   # CPUs report none
    programs = vae.compile_decode(z.shape, path="interpret")
    assert programs.frames == 3
    ref = np.asarray(vae.decode(z, path="plain", frames_per_chunk=1))
    assert ref.shape == (1, 3, 21, 16, 16)
    np.testing.assert_allclose(vae.decode(z, programs=programs), ref, rtol=0, atol=1e-5)
