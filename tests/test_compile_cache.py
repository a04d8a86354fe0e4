"""JAX's persistent compilation cache at ditax's entry points (:mod:`ditax.compile_cache`).

``ditax generate`` runs in fresh processes on a tiny pipeline folder; each process counts jax's
own events (``jax.monitoring``): every compile request (``/jax/core/compile/
backend_compile_duration``, named by program), the requests that went through the persistent
cache, its hits, and its writes (``/jax/compilation_cache/cache_misses``). A second process of
the same shapes must take every program from the cache (hits == requests, no writes; the denoise
step and the VAE decode come whole from ditax's executable cache, :mod:`ditax.exec_cache`,
untraced); with
``compile_cache=none`` nothing touches a cache and no file is written. The scope itself is
checked in-process: where it points, that it restores jax's settings, that ``auto`` nests.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from ditax.compile_cache import compile_cache, default_cache_dir, resolve_cache_dir
from ditax.exec_cache import SUBDIR

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
USE_CACHE = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"
WRITES = "/jax/compilation_cache/cache_misses"   # recorded when a miss is written

# the child: count jax's events, run the CLI, print the counts as the last line
CHILD = """
import json, sys, jax
counts, programs = {}, []
def event(name, **kw):
    counts[name] = counts.get(name, 0) + 1
def duration(name, secs, **kw):
    counts[name] = counts.get(name, 0) + 1
    if name == %r:
        programs.append(str(kw.get("fun_name", "")))
jax.monitoring.register_event_listener(event)
jax.monitoring.register_event_duration_secs_listener(duration)
from ditax.cli import main
rc = main(sys.argv[1:])
print("EVENTS " + json.dumps({"counts": counts, "programs": programs}))
sys.exit(rc)
""" % BACKEND_COMPILE

ARGS = ["--prompt", "a cat walks on the grass", "--negative-prompt", "blurry", "--height", "32",
        "--width", "32", "--frames", "5", "--steps", "2", "--guidance", "4", "--no-progress"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from pipeline_reference import make_tiny_pipeline

    return make_tiny_pipeline(tmp_path_factory.mktemp("cc"), layers=1)[1]


def _generate(folder, out, env_update, *overrides):
    env = {k: v for k, v in os.environ.items() if k != "DITAX_CACHE_DIR"}
    env.update(env_update, PYTHONPATH=os.pathsep.join(sys.path))
    argv = ["generate", "--model", str(folder), *ARGS, "--output", str(out), *overrides]
    run = subprocess.run([sys.executable, "-c", CHILD, *argv], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    line = [l for l in run.stdout.splitlines() if l.startswith("EVENTS ")][-1]
    got = json.loads(line[len("EVENTS "):])
    return got["counts"], got["programs"], run.stdout


def _files(root):
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def _jax_files(root):     # jax's own entries (ditax's executables live in a folder beside)
    return [p for p in _files(root) if p.parts[0] != SUBDIR]


def test_second_process_compiles_nothing(folder, tmp_path):
    xdg = tmp_path / "xdg"
    # 1: a cold cache in the per-user default folder ($XDG_CACHE_HOME/ditax/jax)
    cold, programs, stdout = _generate(folder, tmp_path / "a.mp4", {"XDG_CACHE_HOME": str(xdg)})
    cache = xdg / "ditax" / "jax"
    assert f"compile cache: {cache}" in stdout
    assert "jit(_denoise_step)" in programs and "jit(decode_chunk)" in programs, programs
    assert cold.get(WRITES, 0) > 0 and cold.get(HITS, 0) == 0, cold
    written = _files(cache)
    # the step and the decode's two programs go to ditax's executable cache (built with jax's
    # cache off), every other program to jax's
    executables = [p for p in written if p.parts[0] == SUBDIR]
    assert len(executables) == 2, written
    assert len(_jax_files(cache)) == cold[WRITES] == len(programs) - 3, (written, cold)
    assert " compile 0.00s" not in stdout     # the ahead-of-time phase did compile
    # 2: a new process, same shapes, the folder named by the config key: nothing compiled, and
    # the step and decode not even traced (read whole from ditax's executable cache)
    warm, programs, _ = _generate(folder, tmp_path / "b.mp4", {}, f"compile_cache={cache}")
    assert "jit(_denoise_step)" not in programs and "jit(decode_chunk)" not in programs, programs
    assert warm.get(WRITES, 0) == 0, warm
    assert warm[HITS] == warm[USE_CACHE] == warm[BACKEND_COMPILE] == len(programs), warm
    assert _files(cache) == written


def test_none_turns_it_off(folder, tmp_path):
    xdg = tmp_path / "xdg"
    counts, programs, stdout = _generate(folder, tmp_path / "c.mp4", {"XDG_CACHE_HOME": str(xdg)},
                                         "compile_cache=none")
    assert "compile cache: off" in stdout
    assert programs and counts.get(USE_CACHE, 0) == counts.get(HITS, 0) == 0, counts
    assert not xdg.exists() or not _files(xdg)


# --- the scope, in-process


def test_where_the_cache_goes(tmp_path, monkeypatch):
    monkeypatch.delenv("DITAX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "ditax" / "jax"
    assert resolve_cache_dir("auto") == default_cache_dir()
    assert resolve_cache_dir("none") is None and resolve_cache_dir("off") is None
    assert resolve_cache_dir(str(tmp_path / "mine")) == tmp_path / "mine"
    monkeypatch.setenv("DITAX_CACHE_DIR", str(tmp_path / "env"))
    assert resolve_cache_dir("auto") == tmp_path / "env"
    assert resolve_cache_dir(str(tmp_path / "key")) == tmp_path / "key"  # the key wins
    monkeypatch.setenv("DITAX_CACHE_DIR", "none")
    assert resolve_cache_dir("auto") is None


def test_scope_writes_there_nests_and_restores(tmp_path, monkeypatch):
    monkeypatch.delenv("DITAX_CACHE_DIR", raising=False)
    before = {n: getattr(jax.config, n) for n in (
        "jax_compilation_cache_dir", "jax_enable_compilation_cache",
        "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")}

    def probe(x):       # a fresh program: nothing in any cache
        return jnp.sin(x) * 7.0 + 0.25

    with compile_cache(tmp_path / "outer") as outer:
        assert outer == tmp_path / "outer"
        with compile_cache("auto") as inner:   # a library call inside the CLI's scope
            assert inner == outer
            jax.jit(probe)(jnp.ones((3, 5)))
        with compile_cache("none") as off:
            assert off is None
            jax.jit(probe)(jnp.ones((4, 6)))   # another shape: a new program, not written
    probes = [p for p in _files(outer) if p.name.startswith("jit_probe-")]
    assert len(probes) == 1, _files(outer)    # the (3, 5) program; the (4, 6) one was not kept
    assert {n: getattr(jax.config, n) for n in before} == before


def test_initial_noise_is_the_shaped_draw():
    """The pipeline draws its noise flat (quick to compile): the same values as the 5-D draw
    that ``seed`` has always meant."""
    import numpy as np

    from ditax.pipelines.sampling import initial_noise

    shape = (1, 4, 2, 3, 5)
    want = jax.random.normal(jax.random.PRNGKey(7), shape, jnp.float32)
    np.testing.assert_array_equal(np.asarray(initial_noise(7, shape)), np.asarray(want))


def test_config_key(tmp_path):
    from ditax.config import load_config, validate
    from ditax.errors import ConfigError

    assert load_config(None, []).compile_cache == "auto"
    assert load_config(None, ["compile_cache=none"]).compile_cache == "none"
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=r"compile_cache=.*is a file; give a folder"):
        validate(load_config(None, [f"compile_cache={a_file}"]))
