"""Test setup: 8 fake CPU devices (before JAX is imported), float32 matmuls, fixed seeds."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# no persistent compilation cache unless a test asks for one (hermetic runs, ~/.cache untouched)
os.environ.setdefault("DITAX_CACHE_DIR", "none")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture
def rng():
    """A fresh numpy Generator per test (seeded from the test's node id for reproducibility)."""
    import zlib

    seed = zlib.crc32(os.environ.get("PYTEST_CURRENT_TEST", "x").encode())
    return np.random.default_rng(seed)


def has_cuda() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


@pytest.fixture(scope="module")
def fast_compile():
    """XLA with most optimisations off for one test module (jax's
    ``jax_disable_most_optimizations``): the training tests compile ~3x faster on CPU. The flag
    is restored afterwards and the compile caches cleared, so nothing compiled this way is
    reused by another module."""
    prev = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", prev)
    jax.clear_caches()
