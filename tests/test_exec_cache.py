"""ditax's executable cache (:mod:`ditax.exec_cache`): compiled programs on disk, keyed before
tracing (:mod:`ditax.exec_key`).

A "fresh process" is simulated in-process by a new :class:`~ditax.pipelines.programs.Programs`
and ``jax.clear_caches()``; a traced function appends to :data:`TRACES`, so a program read from
disk is seen not to be traced (nor lowered). Results of a loaded program must be bit-identical
to a fresh compile on fresh random inputs; each key ingredient a test can change must miss; a
corrupt file is a miss that gets rewritten; with the cache off nothing is written. ditax's
source digest is pinned (other edits to the tree while the tests run must not turn the cache
off); one test checks that a source file changed after the process started is uncacheable.
"""

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import ditax
from ditax import exec_cache, exec_key
from ditax.compile_cache import compile_cache
from ditax.pipelines.programs import Programs, signature

TRACES: list = []


@functools.partial(jax.jit, static_argnums=0)
def _probe(power, x, w):
    TRACES.append(power)
    return jnp.tanh(x @ w) ** power + jnp.sum(w, axis=0)


def _with_callback(x):
    jax.debug.callback(lambda v: None, x)
    TRACES.append("callback")
    return x * 2


_callback = jax.jit(_with_callback)


@pytest.fixture(autouse=True)
def pinned_source(monkeypatch):
    monkeypatch.setattr(exec_key, "source_digest", lambda: "pinned")
    TRACES.clear()


def _fresh():
    """What a new process starts with: no compiled program in memory."""
    jax.clear_caches()
    TRACES.clear()
    return Programs()


def _inputs(seed, shape=(4, 8), dtype=jnp.float32, sharding=None):
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, shape, dtype)
    w = jax.random.normal(kw, (shape[-1], 3), dtype)
    if sharding is not None:
        x, w = jax.device_put(x, sharding), jax.device_put(w, sharding)
    return x, w


def _stored(folder):
    sub = folder / exec_cache.SUBDIR
    return sorted(p.name for p in sub.iterdir()) if sub.exists() else []


def _placements():
    devices = jax.devices()
    return {"uncommitted": None, "device 3": jax.sharding.SingleDeviceSharding(devices[3]),
            "mesh": NamedSharding(Mesh(np.array(devices[:2]), ("data",)), PartitionSpec("data"))}


@pytest.mark.parametrize("placement", [pytest.param("uncommitted", marks=pytest.mark.slow),
                                       "device 3", "mesh"])
def test_second_process_loads_without_tracing(tmp_path, placement):
    sharding = _placements()[placement]
    with compile_cache(tmp_path):
        _fresh().step(_probe, (2,), _inputs(0, sharding=sharding))
        assert TRACES == [2] and len(_stored(tmp_path)) == 1
        program = _fresh().step(_probe, (2,), _inputs(0, sharding=sharding))
        assert TRACES == []        # read from disk: not traced, so not lowered either
    x, w = _inputs(1, sharding=sharding)
    got = program(x, w)
    with compile_cache("none"):
        jax.clear_caches()
        want = _probe(2, x, w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim)


@pytest.mark.parametrize("change", ["shape", "dtype", "precision", "static", "xla_flags",
                                    "source", "target", "interpret"])
def test_each_ingredient_misses(tmp_path, monkeypatch, change):
    with compile_cache(tmp_path):
        _fresh().step(_probe, (2,), _inputs(0))
        static, args, context = (2,), _inputs(0), jax.default_matmul_precision(None)
        if change == "shape":
            args = _inputs(0, shape=(5, 8))
        elif change == "dtype":
            args = _inputs(0, dtype=jnp.bfloat16)
        elif change == "precision":     # (the suite runs at "highest")
            other = "default" if jax.config.jax_default_matmul_precision == "highest" else "highest"
            context = jax.default_matmul_precision(other)
        elif change == "static":
            static = (3,)
        elif change == "target":
            context = ditax.target_platform("tpu", device_kind="TPU v5 lite")
        elif change == "interpret":     # a jax thread-local context (not a config value)
            from jax.experimental.pallas import tpu as pltpu

            context = pltpu.force_tpu_interpret_mode()
        elif change == "xla_flags":
            monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_dump_to=")
        else:
            monkeypatch.setattr(exec_key, "source_digest", lambda: "edited")
        with context:
            _fresh().step(_probe, static, args)
        assert TRACES == [static[0]], change       # built again
        assert len(_stored(tmp_path)) == 2          # under a key of its own


def test_key_is_stable_and_names_the_modules():
    key = signature((_probe, (2,)), _inputs(0))
    assert exec_key.key_digest(key) == exec_key.key_digest(
        signature((_probe, (2,)), _inputs(5)))         # values do not count, shapes do
    pickler = exec_key._KeyPickler(__import__("io").BytesIO())
    pickler.dump(key)
    assert __name__ in pickler.modules


def test_corrupt_file_is_a_miss_and_rewritten(tmp_path):
    with compile_cache(tmp_path):
        _fresh().step(_probe, (2,), _inputs(0))
        [name] = _stored(tmp_path)
        path = tmp_path / exec_cache.SUBDIR / name
        path.write_bytes(path.read_bytes()[:100])      # torn
        _fresh().step(_probe, (2,), _inputs(0))
        assert TRACES == [2]
        _fresh().step(_probe, (2,), _inputs(0))
        assert TRACES == []                              # the rewritten file loads
        assert _stored(tmp_path) == [name]


def test_off_writes_nothing(tmp_path):
    with compile_cache(tmp_path), compile_cache("none"):    # jax's switch is ditax's
        _fresh().step(_probe, (2,), _inputs(0))
        _fresh().step(_probe, (2,), _inputs(0))
        assert TRACES == [2]                                # built again: nothing kept
    assert _stored(tmp_path) == []


def test_uncacheable_programs_are_built(tmp_path):
    """A jitted local function cannot be keyed (nothing written); an executable that calls back
    to the host cannot be stored (a marker: later processes build it with jax's cache on)."""
    local = jax.jit(lambda x: x + 1)
    with compile_cache(tmp_path):
        _fresh().step(local, (), (jnp.ones(3),))
        assert _stored(tmp_path) == []
        x = jnp.arange(3.0)
        _fresh().step(_callback, (), (x,))
        assert len(_stored(tmp_path)) == 1 and TRACES == ["callback"]
        program = _fresh().step(_callback, (), (x,))
        assert TRACES == ["callback"]                   # the marker: built again
        np.testing.assert_array_equal(np.asarray(program(x)), [0.0, 2.0, 4.0])



def test_builds_in_threads_run_with_jax_cache_off(tmp_path):
    """Overlapping builds share one switch: each runs with jax's cache off, and jax's setting
    is back after the last one."""
    from concurrent.futures import ThreadPoolExecutor

    seen = []

    def build(i):
        seen.append(jax.config.jax_enable_compilation_cache)
        return jax.jit(lambda v: jnp.cos(v) + i).lower(2.0).compile()

    with compile_cache(tmp_path):
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: exec_cache.cached(("threads", i), lambda: build(i)),
                          range(4)))
        assert jax.config.jax_enable_compilation_cache
    assert seen == [False] * 4 and len(_stored(tmp_path)) == 4


def test_jax_cache_read_while_building_is_not_stored(tmp_path):
    def build():     # as when another thread's scope switched jax's cache back on meanwhile
        jax.monitoring.record_event(exec_cache.JAX_HIT)
        return jax.jit(jnp.sin).lower(1.0).compile()

    with compile_cache(tmp_path):
        exec_cache.cached(("jax hit",), build)
    assert _stored(tmp_path) == []

def test_source_changed_after_start_is_uncacheable(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("x = 1\n")
    old = exec_key.process_start() - 60
    os.utime(module, (old, old))
    assert exec_key._state(module)[0] == str(module)
    now = time.time()
    os.utime(module, (now, now))
    with pytest.raises(exec_key.Uncacheable, match="changed since this process started"):
        exec_key._state(module)


def test_a_source_written_just_before_the_process_started_is_not_changed(tmp_path):
    """The start is read to ~10 ms (``btime``, whole seconds, put it up to 1 s early: a
    checkout made half a second before ``pytest`` started counted as changed while it ran,
    and every executable-cache test failed); the start precedes this module's import."""
    import subprocess
    import sys

    assert exec_key._IMPORTED - 120 < exec_key.process_start() <= exec_key._IMPORTED
    module = tmp_path / "m.py"
    module.write_text("x = 1\n")
    time.sleep(0.3)
    code = ("import sys; from ditax import exec_key; "
            "print(exec_key._state(sys.argv[1])[0])")
    out = subprocess.run([sys.executable, "-c", code, str(module)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == str(module), out.stderr[-400:]



def test_decode_programs_round_trip(tmp_path, monkeypatch):
    """A Wan VAE's DecodePrograms (two executables, the chunk length, the feature cache's
    shapes) come back whole; the decode with them gives the fresh decode's frames."""
    from flax import nnx

    from ditax.models.vae.wan import WanVAE, WanVAEConfig

    vae = WanVAE(WanVAEConfig(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                              temperal_downsample=(False, True, True)), rngs=nnx.Rngs(0))
    shape = (1, 4, 3, 2, 2)
    with compile_cache(tmp_path):
        built = _fresh().decode(vae, shape)
        monkeypatch.setattr(WanVAE, "compile_decode", lambda *a, **k: pytest.fail("rebuilt"))
        loaded = _fresh().decode(vae, shape)
    assert len(_stored(tmp_path)) == 1
    assert loaded.frames == built.frames and loaded.cache == built.cache
    z = jax.random.normal(jax.random.PRNGKey(3), shape)
    np.testing.assert_array_equal(np.asarray(vae.decode(z, programs=loaded)),
                                  np.asarray(vae.decode(z, programs=built)))

# the end-to-end check (slow tier: tests/conftest.py END_TO_END): the demo model in two fresh
# processes sharing one cache folder
CHILD = """
import sys, jax, numpy as np, ditax
from ditax.exec_cache import LOADED
loaded = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: loaded.append(secs) if event == LOADED else None)
pipe = ditax.load_pipeline(ditax.demo.model_path())
pipe.compile_cache = sys.argv[1]
video = pipe("a red ball moves left", seed=0, num_inference_steps=2, num_frames=5, height=32,
             width=32)
np.save(sys.argv[2], np.asarray(video))
print("LOADED", len(loaded))
"""


def test_demo_second_process_reads_the_programs(tmp_path):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("DITAX_CACHE_DIR", None)
    loaded = []
    for name in ("cold", "warm"):
        run = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "cache"),
                              str(tmp_path / f"{name}.npy")], env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        loaded.append(int(run.stdout.split("LOADED")[-1]))
        if name == "cold":
            stored = _stored(tmp_path / "cache")
            assert len(stored) == 2, stored            # the denoise step, the decode
    assert _stored(tmp_path / "cache") == stored      # the warm process wrote nothing new
    # the warm process deserialised both programs (no trace, no lowering, no compile: ~0.3 s
    # against the cold one's ~9 s here; the time is the benchmarks' to say, not a test's)
    assert loaded[0] == 0 and loaded[1] >= len(stored), loaded
    np.testing.assert_array_equal(np.load(tmp_path / "warm.npy"), np.load(tmp_path / "cold.npy"))
