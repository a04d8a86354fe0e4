"""Step-cached requests batch (:func:`ditax.pipelines.batch.sample_batch`), each row deciding
for itself: on the shipped demo Wan model (first_block, TeaCache, MagCache, CFG reuse; CFG
batched and sequential) and on a toy denoiser whose modulation carries the text (TeaCache rows
then decide differently), a batch of 3 requests (other prompts, seeds, negative prompts) equals
each request run alone through the pipeline's call, each row's stats (``last_stats["rows"]``)
are the ones it reports alone, and the batch's stats say what the batch ran: computed where any
row computed, skipped where every row skipped, the blocks executed (counted on the device) only
on those steps. Rows really decide differently where the method's measure is the row's own
(asserted), and a batch of one is the call bit for bit."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ditax
from ditax.pipelines.batch import batch_key, sample_batch
from ditax.pipelines.cache.numbers import match_of, write_numbers
from ditax.pipelines.programs import Programs
from ditax.pipelines.sampling import Expert, Prepared, record
from ditax.schedulers.flow_match import FlowMatchEulerScheduler
from toy_family import ToyDenoiser, toy_inputs, toy_text

N = 6
# float32 rounding of a wider matmul: the demo's plain (uncached) batch of these rows is already
# 1.3e-5 off alone (latents up to ~6); a row given another's decision is off by > 1e-3
TOL = 3e-5
ROWS = [dict(prompt="a cat walks on the grass", seed=1),
        dict(prompt="a red car drives through the rain", seed=2),
        dict(prompt="two birds fly over the sea at dawn", seed=3, negative_prompt="dark")]


def numbers_file(path, config):
    """TeaCache numbers for the toy (made up, not measured: any numbers exercise the rule): the
    polynomial is the identity, so the accumulated change is the modulation's own."""
    return write_numbers(path, dict(
        name="toy", match={k: v for k, v in match_of(config).items() if v is not None},
        teacache=dict(input="modulation", coefficients=[0, 0, 0, 1.0, 0], retention_ratio=0.1)))


def _check(pipe, calls, *, differ: bool):
    """Each row == its request alone (``pipe(**call)``), its stats too; the batch's stats are
    what ran; rows decided differently on some step iff ``differ``. Returns the batch stats."""
    alone, own = [], []
    for c in calls:
        alone.append(pipe(progress=False, **c))
        own.append(pipe.last_stats)
    got = sample_batch(pipe, calls)
    st = pipe.last_stats
    assert len(got) == len(calls)
    for g, a in zip(got, alone):
        assert g.shape == a.shape
        err = float(np.abs(g - a).max())
        assert err < TOL, err
    assert float(np.abs(alone[0] - alone[1]).max()) > 1e-3     # each row got its own request
    rows = st["rows"]
    assert len(rows) == len(calls)
    for r, o in zip(rows, own):
        assert "rows" not in o
        assert r == {k: o[k] for k in r}, (r, o)
    names = list(st["computed_steps"])
    for b in names:
        computed = set().union(*(o["computed_steps"][b] for o in own))
        skipped = set.intersection(*(set(o["skipped_steps"][b]) for o in own))
        assert st["computed_steps"][b] == sorted(computed)
        assert st["skipped_steps"][b] == sorted(skipped)
    assert st["transformer_calls"] == sum(map(len, st["computed_steps"].values()))
    assert st["transformer_calls"] < len(names) * N        # whole-batch skips: the saving
    if "cfg_reused_steps" in st:
        assert all(o["cfg_reused_steps"] == st["cfg_reused_steps"] for o in own)
    decided = [(r["skipped_steps"], r.get("cfg_reused_steps")) for r in rows]
    assert (len(set(map(repr, decided))) > 1) == differ, decided
    if differ:    # some step computed for the batch that a row skipped: it took its cache
        assert any(set(r["skipped_steps"][b]) & set(st["computed_steps"][b])
                   for r in rows for b in names)
    return st


@pytest.fixture(scope="module")
def wan():
    """The shipped demo model (a trained Wan 2.1 of 4 layers; its TeaCache / MagCache numbers
    are shipped) and 3 requests of one program shape."""
    from ditax.demo import model_path

    pipe = ditax.load_pipeline(model_path())
    pipe.compile_cache = "none"
    base = dict(negative_prompt="blurry", height=32, width=32, num_frames=5, guidance_scale=5.0,
                num_inference_steps=N, output="latent")
    return pipe, [dict(base, **r) for r in ROWS]


# (cache settings, whether the rows decide differently). Each threshold decides as it does 5 %
# below and above it (far from float rounding). first_block measures the row's own
# block-0 residual; MagCache's measure is a per-step table and Wan's modulation (TeaCache's)
# depends on the timestep only, so their rows decide alike (the toy below has a text-dependent
# modulation); CFG reuse is by step index
WAN_CASES = {
    "first_block": (dict(cache="first_block", cache_threshold=0.3), True),
    "first_block_cfg_cache": (dict(cache="first_block", cache_threshold=0.3, cfg_cache=True),
                              True),
    "teacache": (dict(cache="teacache", cache_threshold=0.25), False),
    "magcache_cfg_cache": (dict(cache="magcache", cache_threshold=0.12, cfg_cache=True), False),
}


@pytest.mark.parametrize("case", list(WAN_CASES))
def test_wan_cached_rows_equal_their_requests_alone(wan, case):
    pipe, calls = wan
    cache, differ = WAN_CASES[case]
    calls = [dict(c, **cache) for c in calls]
    assert len({batch_key(c) for c in calls}) == 1       # a server would batch them
    st = _check(pipe, calls, differ=differ)
    assert st["cache"] == cache["cache"] and st["cfg_cache"] == cache.get("cfg_cache", False)
    if case == "first_block":
        # a batch of one is the call bit for bit, stats included (no per-row list)
        one, = sample_batch(pipe, calls[1:2])
        stats = pipe.last_stats
        np.testing.assert_array_equal(one, pipe(progress=False, **calls[1]))
        assert stats == pipe.last_stats and "rows" not in stats
        # padded to a server's bucket of 4 (row 0 repeated): the padding's stats are dropped
        padded = sample_batch(pipe, calls, pad_to=4)
        assert len(padded) == 3 and len(pipe.last_stats["rows"]) == 3
        assert {k: v for k, v in pipe.last_stats.items() if k != "rows"} == {
            k: v for k, v in st.items() if k != "rows"}
        np.testing.assert_allclose(padded[2], pipe(progress=False, **calls[2]), rtol=0,
                                   atol=TOL)


def test_wan_sequential_cfg_each_branch_decides_per_row(wan):
    """With cfg_mode="sequential" each branch of each row decides alone."""
    pipe, calls = wan
    calls = [dict(c, cache="first_block", cache_threshold=0.3) for c in calls]
    pipe.cfg_mode = "sequential"
    try:
        _check(pipe, calls, differ=True)
    finally:
        pipe.cfg_mode = "batched"


def test_other_cache_settings_do_not_share_a_batch(wan):
    pipe, calls = wan
    a = dict(calls[0], cache="first_block", cache_threshold=0.3)
    for change in (dict(cache_threshold=0.2), dict(cfg_cache=True), dict(cache="magcache")):
        assert batch_key({**a, **change}) != batch_key(a), change
    with pytest.raises(ValueError, match="cache_threshold"):
        sample_batch(pipe, [a, dict(calls[1], cache="first_block", cache_threshold=0.2)])


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    channels: int = 4
    text_dim: int = 8
    width: int = 16
    freq_dim: int = 16
    num_layers: int = 3


class ToyPipe:
    """A batching pipeline over the toy denoiser (its modulation is the time embedding plus
    the mean text, so TeaCache's measure differs per prompt): ``prepare`` hands out the loop's
    parts, the call is ``prepare(...).run()``, as the families' pipelines."""

    batches = True
    load_time = 0.0

    def __init__(self, numbers_dir, cfg_mode="batched"):
        module = ToyDenoiser(ToyConfig(), nnx.Rngs(7))
        gdef, state = nnx.split(module)
        self.expert = Expert(gdef, state, module.cfg)
        self.programs = Programs()
        self.scheduler = FlowMatchEulerScheduler(shift=3.0)
        self.cfg_mode = cfg_mode
        self.numbers = numbers_file(numbers_dir / "toy.json", module.cfg)

    def prepare(self, prompt, negative_prompt="", seed=0, num_inference_steps=N,
                guidance_scale=3.0, cache=None, cache_threshold=None, cfg_cache=False):
        def text(use_cfg):
            prompts = [prompt, negative_prompt] if use_cfg else [prompt]
            return jnp.asarray(np.stack([toy_text(p, 3, ToyConfig.text_dim) for p in prompts]))
        return Prepared(programs=self.programs, experts=[self.expert], inputs=toy_inputs,
                        scheduler=self.scheduler, latent_shape=(1, 4, 1, 4, 4), text=text,
                        num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
                        seed=seed, cfg_mode=self.cfg_mode, cache=cache,
                        cache_threshold=cache_threshold, cfg_cache=cfg_cache,
                        cache_coefficients=self.numbers)

    def __call__(self, progress=False, **call):
        return record(self, self.prepare(**call).run(progress))


@pytest.fixture
def block_rows(monkeypatch):
    """Rows that went through the toy's blocks (TeaCache runs them only on computed steps),
    counted on the device."""
    rows = []
    original = ToyDenoiser.run_blocks

    def counted(self, h, *args, **kwargs):
        jax.debug.callback(functools.partial(rows.append, h.shape[0]))
        return original(self, h, *args, **kwargs)

    monkeypatch.setattr(ToyDenoiser, "run_blocks", counted)
    return rows


@pytest.mark.parametrize("cfg_mode,threshold", [("batched", 1.0), ("sequential", 0.7)])
def test_toy_teacache_rows_decide_differently(tmp_path, block_rows, cfg_mode, threshold):
    """A fresh pipeline (its programs traced with the counting blocks): rows skip on different
    steps, each equals its request alone, and the blocks ran on the batch's computed steps
    only, for every row of the forward."""
    pipe = ToyPipe(tmp_path, cfg_mode)
    calls = [dict(r, cache="teacache", cache_threshold=threshold) for r in ROWS]
    alone = [pipe(**c) for c in calls]
    jax.effects_barrier()
    block_rows.clear()
    got = sample_batch(pipe, calls)
    jax.effects_barrier()
    st = pipe.last_stats
    # each forward over one branch of the 3 rows (or both: 6 rows, counted as two calls)
    assert sum(block_rows) == st["transformer_calls"] * len(calls)
    for g, a in zip(got, alone):
        np.testing.assert_allclose(g, a, rtol=0, atol=TOL)
    _check(pipe, calls, differ=True)
