"""Step caching in the compiled denoise step (first_block, teacache, magcache, CFG reuse) on a
tiny random pipeline: ``cache=None`` is the plain step (bit-identical), a threshold of 0 never
skips (equal output), a larger one skips steps that really do not run (block executions counted
on the device with ``jax.debug.callback``) and nothing recompiles between steps or thresholds;
each method on an 8-device mesh gives the single-device result; ``ditax calibrate-cache``
writes numbers the pipeline loads; bad requests are refused with the fix."""

import functools
import json

import jax
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.cli import main  # noqa: E402
from ditax.config import AttentionConfig  # noqa: E402
from ditax.errors import ConfigError, RequestError  # noqa: E402
from ditax.models.wan import transformer as wan_transformer  # noqa: E402
from ditax.parallel import make_mesh  # noqa: E402
from ditax.pipelines.cache.numbers import (  # noqa: E402
    SHIPPED, MagCacheNumbers, find_numbers, merge_numbers, read_numbers)
from ditax.pipelines.cache.calibrate import fit_teacache  # noqa: E402
from ditax.pipelines.cache.step_cache import (  # noqa: E402
    CFG_REFRESH_EVERY, METHODS, cfg_reuse_steps)
from compiles import compiles  # noqa: E402
from pipeline_reference import make_tiny_pipeline  # noqa: E402

H = W = 32
FRAMES = 5
N = 6
REQ = dict(prompt="a cat walks on the grass", negative_prompt="blurry, low quality", height=H,
           width=W, num_frames=FRAMES, guidance_scale=5.0, progress=False)
CACHED = "cached_denoise_step"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _, folder = make_tiny_pipeline(tmp_path_factory.mktemp("sc"))
    pipe = ditax.load_pipeline(folder)
    pipe.compile_cache = "none"
    lat = np.random.default_rng(0).standard_normal(
        pipe.latent_shape(H, W, FRAMES)).astype(np.float32)
    return folder, pipe, lat


@pytest.fixture(scope="module")
def numbers(tiny, tmp_path_factory):
    """This model's numbers, measured by the command line."""
    folder, pipe, _ = tiny
    out = tmp_path_factory.mktemp("num") / "tiny.json"
    rc = main(["calibrate-cache", "--model", str(folder), "--prompts", "a cat walks on the grass",
               "a red car drives through the rain", "--negative-prompt", "blurry",
               "--height", str(H), "--width", str(W), "--frames", str(FRAMES), "--steps",
               str(N), "--guidance", "5", "--output", str(out), "--no-progress",
               "compile_cache=none"])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def base(tiny):
    _, pipe, lat = tiny
    return pipe(latents=lat, num_inference_steps=N, **REQ)


def test_cache_none_is_the_plain_step(tiny, base):
    _, pipe, lat = tiny
    with compiles() as log:
        got = pipe(latents=lat, num_inference_steps=N, cache=None, cfg_cache=False, **REQ)
    np.testing.assert_array_equal(got, base)
    assert log.count(CACHED) == 0
    st = pipe.last_stats
    assert st["steps"] == N and st["transformer_calls"] == 2 * N and st["cache"] is None


def test_calibration_file(tiny, numbers):
    _, pipe, _ = tiny
    entry, = read_numbers(numbers)
    cfg = pipe.transformer.config
    assert entry["match"]["inner_dim"] == cfg.inner_dim
    assert entry["match"]["num_layers"] == cfg.num_layers
    cond, uncond = entry["magcache"]["ratios"]
    assert len(cond) == len(uncond) == N and cond[0] == 1.0
    assert all(0.5 < r < 2.0 for r in cond[1:]), cond   # |r_t| / |r_t-1| of a real run
    assert len(entry["teacache"]["coefficients"]) == 5
    assert np.isfinite(entry["teacache"]["coefficients"]).all()


def test_merge_numbers_replaces_by_name(numbers, tmp_path):
    ship = tmp_path / "ship.json"
    ship.write_text(SHIPPED.read_text())
    entry, = read_numbers(numbers)
    merge_numbers(ship, entry)
    merge_numbers(ship, dict(entry, source="again"))
    models = read_numbers(ship)
    assert [m["name"] for m in models] == [m["name"] for m in read_numbers(SHIPPED)] + [
        entry["name"]]
    assert models[-1]["source"] == "again"
    before = SHIPPED.read_text()
    assert ship.read_text().startswith(before[:before.rindex("  }")])   # the layout is kept


def test_shipped_numbers_cover_the_demo_model():
    """`ditax calibrate-cache --model demo --into src/ditax/pipelines/cache/step_cache_numbers.json`."""
    from ditax.config import ModelConfig
    from ditax.demo import SAMPLE, model_path
    from ditax.models.wan.loading import read_config

    cfg = ModelConfig.from_diffusers(read_config(model_path() / "transformer"))
    numbers = find_numbers(cfg, 1)
    assert numbers is not None and numbers.name == "ditax-demo"
    assert numbers.teacache is not None
    assert len(numbers.magcache.ratios[0]) == SAMPLE["num_inference_steps"]


def test_teacache_fit_recovers_a_polynomial():
    x = np.linspace(0.01, 0.3, 40)
    want = [3.0, -2.0, 0.5, 1.5, 0.01]
    got = fit_teacache(x, np.polyval(want, x))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_magcache_ratios_follow_the_step_count():
    m = MagCacheNumbers((tuple(np.linspace(1, 0.5, 50)), tuple(np.linspace(1, 0.6, 50))),
                        0.2, 2)
    r = m.per_step(8)
    assert r.shape == (8, 2) and r[0, 0] == 1.0 and np.isclose(r[-1, 0], 0.5)
    assert (np.diff(r[:, 0]) < 0).all()


@pytest.mark.parametrize("method", METHODS)
def test_threshold_zero_equals_uncached_larger_skips_no_recompile(tiny, base, numbers, method):
    _, pipe, lat = tiny
    kw = dict(REQ, latents=lat, num_inference_steps=N, cache=method, cache_coefficients=numbers)
    with compiles() as first:
        never = pipe(cache_threshold=0.0, **kw)
    assert first.count(CACHED) <= 1, first.names      # N steps, one program
    assert pipe.last_stats["transformer_calls"] == 2 * N
    assert np.abs(never - base).max() <= 1e-6
    with compiles() as again:
        tiny_thr = pipe(cache_threshold=1e-3, **kw)
        calls_tiny = pipe.last_stats["transformer_calls"]
        some = pipe(cache_threshold=10.0, **kw)
    assert again.count(CACHED) == 0, again.names      # another threshold: the same program
    st = pipe.last_stats
    assert st["cache"] == method and st["cache_threshold"] == 10.0
    skipped = st["skipped_steps"]
    assert skipped["cond"] and 0 not in skipped["cond"]   # the first step always runs
    assert st["transformer_calls"] == 2 * N - len(skipped["cond"]) - len(skipped["uncond"])
    assert calls_tiny >= st["transformer_calls"]
    assert np.abs(tiny_thr - base).max() < 0.02
    diff = np.abs(some - base).max()
    assert 0 < diff < 0.1, diff    # steps really skipped, the video still close


@pytest.fixture
def block_rows(monkeypatch):
    """Rows (batch entries) that went through a transformer block, counted on the device."""
    rows = []
    original = wan_transformer.WanBlock.__call__

    def counted(self, x, *args, **kwargs):
        jax.debug.callback(functools.partial(rows.append, x.shape[0]))
        return original(self, x, *args, **kwargs)

    monkeypatch.setattr(wan_transformer.WanBlock, "__call__", counted)
    return rows


@pytest.mark.parametrize("method,cfg_cache,steps", [("first_block", False, 7),
                                                    ("magcache", True, 8)])
def test_skipped_steps_do_not_run(tiny, base, numbers, block_rows, method, cfg_cache, steps):
    """Each step count is used only here, so the step is traced with the counting block."""
    _, pipe, lat = tiny
    pipe(latents=lat, num_inference_steps=steps, cache=method, cache_threshold=10.0,
         cfg_cache=cfg_cache, cache_coefficients=numbers, **REQ)
    jax.effects_barrier()
    st = pipe.last_stats
    layers = pipe.transformer.config.num_layers
    calls = st["transformer_calls"]
    assert calls < 2 * steps
    if method == "first_block":     # block 0 runs for both branches every step
        assert sum(block_rows) == 2 * steps + calls * (layers - 1)
    else:                           # skipped: no block at all
        assert sum(block_rows) == calls * layers
    if cfg_cache:
        t = np.asarray(pipe.scheduler.set_timesteps(steps, lat.shape).timesteps)
        want = np.flatnonzero(cfg_reuse_steps(t, pipe.scheduler.num_train_timesteps)).tolist()
        assert want and st["cfg_reused_steps"] == want
        low = np.flatnonzero(t < 641)
        assert low[0] not in want and len(want) == len(low) - -(-len(low) // CFG_REFRESH_EVERY)
        assert not set(want) & set(st["computed_steps"]["uncond"])


@pytest.fixture(scope="module")
def sharded(tiny):
    """fsdp=2 (the CFG batch) x context=4 (the sequence, Ulysses) on the 8 devices."""
    p = ditax.load_pipeline(tiny[0], mesh=make_mesh({"fsdp": 2, "context": 4}),
                            attention=AttentionConfig(backend="ulysses"))
    p.compile_cache = "none"
    return p


@pytest.mark.parametrize("method", METHODS)
def test_each_method_on_a_mesh(tiny, sharded, numbers, method):
    _, single, lat = tiny
    thr = {"first_block": 0.05, "teacache": 1.0, "magcache": 0.05}[method]   # some skips
    kw = dict(REQ, latents=lat, num_inference_steps=N, cache=method, cache_threshold=thr,
              cache_coefficients=numbers, output="latent")
    want = single(**kw)
    skipped = single.last_stats["skipped_steps"]
    with compiles() as log:
        got = sharded(**kw)
    assert log.count(CACHED) <= 1
    assert sharded.last_stats["skipped_steps"] == skipped
    assert sum(map(len, skipped.values())) > 0   # the comparison covers skipped steps
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("change,match", [
    (dict(cache="tea_cache"), r"cache='tea_cache' is not one of first_block, teacache, "
                              r"magcache.*did you mean 'teacache'"),
    (dict(cache="magcache", cache_threshold=-0.1), r"cache_threshold=-0.1 must be a number >= 0"),
    (dict(cache_threshold=0.1), r"cache_threshold=0.1 needs a cache method"),
    (dict(cfg_cache=True, guidance_scale=1.0), r"cfg_cache=True .* guidance, which is off"),
    (dict(cfg_cache="yes"), r"cfg_cache='yes' must be True or False"),
    (dict(cache="teacache"), r"cache=.teacache. needs per-model numbers .*`ditax "
                             r"calibrate-cache"),
])
def test_bad_cache_requests(tiny, change, match):
    _, pipe, lat = tiny
    with pytest.raises(RequestError, match=match):
        pipe(**{**REQ, "latents": lat, "num_inference_steps": N, **change})


def test_bad_numbers_files(tiny, tmp_path, numbers):
    _, pipe, lat = tiny
    kw = dict(REQ, latents=lat, num_inference_steps=N, cache="magcache")
    with pytest.raises(ConfigError, match="is not a file"):
        pipe(cache_coefficients=tmp_path / "nope.json", **kw)
    other = json.loads(numbers.read_text())
    other["models"][0]["match"]["num_layers"] = 99
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError, match="has no entry for this model .*calibrate-cache"):
        pipe(cache_coefficients=tmp_path / "other.json", **kw)
    other["models"][0]["magcache"]["max_skip_steps"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError, match=r"max_skip_steps=0 must be an integer >= 1"):
        pipe(cache_coefficients=tmp_path / "bad.json", **kw)


def test_cfg_cache_refused_where_batch_is_split(tiny, sharded):
    _, _, lat = tiny
    with pytest.raises(RequestError, match=r"cfg_cache=True .* data\*fsdp=2; put the devices "
                                           r"on mesh.context"):
        sharded(latents=lat, num_inference_steps=N, cfg_cache=True, **REQ)


def test_generate_command_reports_the_calls(tiny, numbers, tmp_path, capsys):
    folder = tiny[0]
    rc = main(["generate", "--model", str(folder), "--prompt", "a cat", "--height", str(H),
               "--width", str(W), "--frames", str(FRAMES), "--steps", str(N), "--no-progress",
               "--output", str(tmp_path / "a.mp4"), "sample.cache=magcache",
               "sample.cache_threshold=10", f"sample.cache_coefficients={numbers}",
               "compile_cache=none"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "step cache magcache (threshold 10.0)" in out and "transformer calls for 6 steps" in out
    assert (tmp_path / "a.mp4").stat().st_size > 0
    rc = main(["generate", "--model", str(folder), "--prompt", "a cat", "--output",
               str(tmp_path / "b.mp4"), "sample.cache=firstblock"])
    assert rc == 2 and "did you mean 'first_block'" in capsys.readouterr().err
