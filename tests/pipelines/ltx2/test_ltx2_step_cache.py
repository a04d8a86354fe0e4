"""Step caching on LTX-2 (two token streams, LTX-2's own guidance with its spatio-temporal-
guidance and modality-isolation passes as branches of their own), on the tiny shared
``LTX2Pipeline`` folder with every guidance term on: a threshold of 0 never skips and gives the
uncached latents exactly; a large one skips steps of every branch (counted in
``last_stats``), changes the latents and stays close; a skipped step is, by hand, each
branch's own cached residual of both streams re-applied on block 0's output, the residuals
being the blocks' real ones of the step that ran them; bad cache arguments are one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ditax
from ditax.errors import RequestError
from ditax.pipelines.cache.policy import SKIPPED
from ditax.pipelines.cache.step_cache import plan_step_cache
from ditax.pipelines.denoise import scheduler_update, text_rows
from ditax.pipelines.sampling import set_timesteps
from ltx2_pipeline_reference import shared_ltx2_pipeline
from wan_reference import rel_err

PROMPT = "a drummer on a beach at sunset"
N = 4
STG = (1,)       # the tiny transformer's 2nd of 2 blocks
BRANCHES = ("cond", "uncond", "stg", "modality")
CALL = dict(height=32, width=32, num_frames=5, frame_rate=24.0, max_sequence_length=16,
            num_inference_steps=N, guidance_scale=3.0, audio_guidance_scale=7.0, stg_scale=1.0,
            modality_scale=3.0, guidance_rescale=0.7, stg_blocks=STG, seed=3, progress=False,
            output="latent")


@pytest.fixture(scope="module")
def pipe():
    root, _ = shared_ltx2_pipeline()
    return ditax.load_pipeline(root)


@pytest.fixture(scope="module")
def base(pipe):
    return pipe(PROMPT, **CALL)


def test_threshold_zero_is_uncached_larger_skips_every_branch(pipe, base):
    never = pipe(PROMPT, cache="first_block", cache_threshold=0.0, **CALL)
    st = pipe.last_stats
    assert st["transformer_calls"] == 4 * N     # cond, uncond, stg, modality every step
    assert st["computed_steps"] == {b: list(range(N)) for b in BRANCHES}
    for k in ("video", "audio"):                # measured: equal bit for bit
        np.testing.assert_array_equal(never[k], base[k])
    some = pipe(PROMPT, cache="first_block", cache_threshold=10.0, **CALL)
    st = pipe.last_stats
    assert st["cache"] == "first_block" and st["cache_threshold"] == 10.0
    assert st["skipped_steps"] == {b: list(range(1, N)) for b in BRANCHES}
    assert st["transformer_calls"] == 4            # step 0 of each branch only
    for k in ("video", "audio"):                # skips change each stream, which stays close
        err = rel_err(some[k], base[k])
        assert 1e-3 < err < 0.1, (k, err)       # measured: video 0.024, audio 0.015


def test_skipped_step_reapplies_each_branchs_residual_of_both_streams(pipe):
    """Two steps of the cached step program (the same program as the pipeline's call: same
    shapes and policy); step 1 skips on every branch. By hand: the carry's residual after
    step 0 is each branch's real blocks-1.. residual of both streams, and step 1 is LTX-2's
    guidance of ``head(block_0(embed(x_1)) + residual)`` per branch, then Euler."""
    prep = pipe.prepare(PROMPT, **{k: v for k, v in CALL.items() if k != "progress"},
                        cache="first_block", cache_threshold=10.0)
    expert, = prep.experts
    text, cond = prep.text(True), prep.condition()
    x0 = jax.random.normal(jax.random.PRNGKey(0), prep.latent_shape, jnp.float32)
    state = set_timesteps(prep.scheduler, N, prep.latent_shape, prep.sigmas)
    timesteps = np.asarray(state.timesteps)
    cache = plan_step_cache("first_block", 10.0, False, use_cfg=True, cfg_mode=prep.cfg_mode,
                            mesh=None, timesteps=timesteps, config=expert.config,
                            num_train_timesteps=1000, experts=[expert] * N)
    step = cache.compile(prep.programs, expert, prep.inputs, prep.scheduler, prep.cfg_mode,
                         True, state, x0, text, cond)
    g = jnp.float32(prep.guidance_scale)
    x1, state1 = step(expert.params, state, x0, text, g, cond)
    residual = cache.carry["residual"]
    x2, _ = step(expert.params, state1, x1, text, g, cond)
    assert cache.names == BRANCHES
    assert (np.asarray(cache.carry["per_step"])[1] == SKIPPED).all()

    @jax.jit
    def hand(params, x0, x1, residual):
        model = nnx.merge(expert.graphdef, params)
        rule = prep.inputs
        depth = pipe.transformer.config.num_layers

        def branch(b, x, t):
            xi, tb, extras = rule(model, cond, x, t)
            extra = dict(stg=dict(stg_blocks=STG), modality=dict(isolate=True)).get(b, {})
            rows = slice(1, 2) if b == "uncond" else slice(0, 1)
            h, ctx = model.embed(xi, tb, text_rows(text, rows), **extras, **extra)
            return model.run_blocks(h, ctx, 0, 1), ctx

        outs, real = {}, {}
        for k, b in enumerate(BRANCHES):
            h1, ctx = branch(b, x0, timesteps[0])
            real[b] = jax.tree.map(jnp.subtract, model.run_blocks(h1, ctx, 1, depth), h1)
            h1, ctx = branch(b, x1, timesteps[1])
            outs[b] = model.head(jax.tree.map(lambda a, r: a + r[k:k + 1], h1, residual), ctx)

        class Passes:        # the guide's further forwards: the branches' outputs above
            def __init__(self):
                self.left = [outs["stg"], outs["modality"]]

            def __call__(self, *args, **kwargs):
                return self.left.pop(0)

            def __getattr__(self, name):
                return getattr(model, name)

        v = rule.guide(Passes(), rule(model, cond, x1, timesteps[1]), text, outs["cond"],
                       outs["uncond"], g)
        return scheduler_update(prep.scheduler, state1, v, x1)[0], real

    want, real = hand(expert.params, x0, x1, residual)
    for k, b in enumerate(BRANCHES):
        for s, (got, true) in enumerate(zip(residual, real[b])):     # video, audio
            assert rel_err(got[k:k + 1], true) <= 1e-5, (b, s, rel_err(got[k:k + 1], true))
    assert rel_err(residual[0][2], residual[0][0]) > 1e-2     # stg's own, not cond's
    assert rel_err(residual[1][3], residual[1][0]) > 1e-2     # modality's own audio
    assert rel_err(x2, want) <= 1e-5, rel_err(x2, want)    # measured 1.6e-7 (residuals 2.0e-7)


@pytest.mark.parametrize("change,words", [
    (dict(cache="tea_cache"), "did you mean 'teacache'"),
    (dict(cache="magcache", cache_threshold=-1.0), "cache_threshold=-1.0 must be a number >= 0"),
    (dict(cfg_cache="yes"), "cfg_cache='yes' must be True or False"),
    (dict(cache="teacache"), "needs per-model numbers and none are known for this model"),
])
def test_bad_cache_arguments_are_one_line(pipe, change, words):
    with pytest.raises(RequestError) as e:
        pipe(PROMPT, **{**CALL, **change})
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
