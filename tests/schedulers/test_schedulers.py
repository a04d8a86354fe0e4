"""UniPC and flow-match Euler against diffusers (torch, CPU): schedules, rollouts, jit."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from compiles import compiles  # noqa: E402

from ditax.schedulers import (FlowMatchEulerScheduler, UniPCScheduler,  # noqa: E402
                              add_flow_noise, from_config, load_scheduler, override_config)

# What a Wan 2.1 diffusers folder ships in scheduler/scheduler_config.json (480p: shift 3).
WAN_UNIPC = {
    "_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.33.0",
    "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0,
    "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True,
    "prediction_type": "flow_prediction", "rescale_betas_zero_snr": False,
    "sample_max_value": 1.0, "solver_order": 2, "solver_p": None, "solver_type": "bh2",
    "steps_offset": 0, "thresholding": False, "timestep_spacing": "linspace",
    "trained_betas": None, "use_beta_sigmas": False, "use_exponential_sigmas": False,
    "use_flow_sigmas": True, "use_karras_sigmas": False,
}
EULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
         "shift": 3.0}

SHAPE = (1, 4, 2, 3, 5)  # [B, C, F, Y, X]


def _ref(cfg):
    cls = getattr(diffusers, cfg["_class_name"])
    return cls.from_config({k: v for k, v in cfg.items() if not k.startswith("_")})


@pytest.mark.parametrize("steps,shift", [(1, 3.0), (2, 1.0), (10, 3.0), (50, 5.0), (37, 7.5)])
def test_timesteps_match(steps, shift):
    for cfg in ({**WAN_UNIPC, "flow_shift": shift}, {**EULER, "shift": shift}):
        ref = _ref(cfg)
        ref.set_timesteps(steps)
        state = from_config(cfg).set_timesteps(steps, SHAPE)
        np.testing.assert_array_equal(np.asarray(state.timesteps), ref.timesteps.numpy())
        np.testing.assert_array_equal(np.asarray(state.sigmas), ref.sigmas.numpy())


#: LTX-2's scheduler: the dynamic shift of the video token count, stretched to end at 0.1
LTX2 = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
        "shift": 1.0, "use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05,
        "base_image_seq_len": 1024, "max_image_seq_len": 4096, "shift_terminal": 0.1}


@pytest.mark.parametrize("steps,tokens,explicit", [(8, 1536, True), (30, 6144, True),
                                                   (5, 600, False)])
def test_terminal_stretch_matches(steps, tokens, explicit):
    """``shift_terminal`` (LTX-2's schedule) on the dynamic shift, with the pipeline's explicit
    sigmas and with the even spacing: the same float32 tables as diffusers."""
    from ditax.schedulers.flow_match import flux_mu

    ref = _ref(LTX2)
    mu = flux_mu(tokens, 1024, 4096, 0.95, 2.05)
    sigmas = np.linspace(1.0, 1.0 / steps, steps) if explicit else None
    ref.set_timesteps(steps, sigmas=sigmas, mu=mu)
    state = from_config(LTX2).with_mu(tokens).set_timesteps(steps, SHAPE, sigmas=sigmas)
    np.testing.assert_array_equal(np.asarray(state.sigmas), ref.sigmas.numpy())
    np.testing.assert_array_equal(np.asarray(state.timesteps), ref.timesteps.numpy())
    assert abs(float(state.sigmas[-2]) - 0.1) < 1e-6      # the last step's sigma is the terminal
    with pytest.raises(ValueError, match="shift_terminal=1.5"):
        from_config({**LTX2, "shift_terminal": 1.5})


def _rollout_ref(ref, steps, x, outs):
    ref.set_timesteps(steps)
    xs = []
    x = torch.from_numpy(x)
    for t, v in zip(ref.timesteps, outs):
        x = ref.step(torch.from_numpy(v), t, x).prev_sample
        xs.append(x.numpy())
    return xs


def _rollout_ours(sched, steps, x, outs, jit):
    state = sched.set_timesteps(steps, x.shape)
    x = jnp.asarray(x)
    step = sched.step
    if jit:
        # One compiled program (jax.stages.Compiled) for every step: it refuses arguments of
        # another structure, shape or dtype, so a state that changed between steps would fail.
        step = jax.jit(sched.step).lower(state, jnp.asarray(outs[0]), x).compile()
    xs, ts = [], []
    for v in outs:
        ts.append(np.asarray(state.timesteps[state.step_index]))
        x, state = step(state, jnp.asarray(v), x)
        xs.append(np.asarray(x))
    return xs, ts, state


def test_compile_counter_sees_compiles():
    """tests/refs/compiles.py (used by the VAE and pipeline tests) sees jax's compilations: a fresh
    jitted function compiles once, a second call of the same shapes compiles nothing."""
    def probe(x):
        return x * 3.0 + 1.0

    f = jax.jit(probe)
    with compiles() as log:
        f(jnp.ones((7, 13)))
        f(jnp.ones((7, 13)) * 2)
    assert log.count("probe") == 1, log.names


CASES = [
    ("unipc-wan", WAN_UNIPC, 12),
    ("unipc-short", WAN_UNIPC, 4),  # warm-up, order-2 and final order-1 steps, also eager
    ("unipc-no-lof", {**WAN_UNIPC, "lower_order_final": False, "final_sigmas_type": "sigma_min",
                      "flow_shift": 5.0}, 11),
    ("unipc-bh1-o1", {**WAN_UNIPC, "solver_type": "bh1", "solver_order": 1}, 10),
    ("unipc-disable", {**WAN_UNIPC, "disable_corrector": [0, 4]}, 10),
    ("euler", EULER, 12),
]


@pytest.mark.parametrize("name,cfg,steps", CASES, ids=[c[0] for c in CASES])
def test_rollout_matches_diffusers(rng, name, cfg, steps):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    # Velocity-like outputs with an offset so that x0 predictions differ step to step.
    outs = [(0.8 * rng.standard_normal(SHAPE) + 0.3).astype(np.float32) for _ in range(steps)]
    want = _rollout_ref(_ref(cfg), steps, x, outs)
    ref = _ref(cfg)
    ref.set_timesteps(steps)
    sched = from_config(cfg)
    # Eager (op-by-op) stepping is slow on CPU: compared on short schedules (below) and Euler.
    modes = (True, False) if name in ("unipc-short", "euler") else (True,)
    results = {}
    for jit in modes:
        got, ts, state = _rollout_ours(sched, steps, x, outs, jit)
        np.testing.assert_array_equal(np.stack(ts), ref.timesteps.numpy())
        err = max(float(np.max(np.abs(g - w)) / np.max(np.abs(w))) for g, w in zip(got, want))
        print(f"{name} jit={jit} max rel err over {steps} steps: {err:.2e}")
        assert err < 1e-5, (name, jit, err)
        assert int(state.step_index) == steps
        results[jit] = got
    if False in results:  # the jitted step (traced index) equals the eager one
        for a, b in zip(results[False], results[True]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_fori_loop_rollout_equals_python_loop(rng):
    """The whole denoising loop inside lax.fori_loop (traced index) equals the Python loop."""
    sched = from_config(WAN_UNIPC)
    steps = 8
    x = rng.standard_normal(SHAPE).astype(np.float32)
    outs = jnp.asarray(rng.standard_normal((steps,) + SHAPE).astype(np.float32))

    def body(i, carry):
        x, state = carry
        return sched.step(state, outs[i], x)

    x_loop, _ = jax.jit(lambda x, s: jax.lax.fori_loop(0, steps, body, (x, s)))(
        jnp.asarray(x), sched.set_timesteps(steps, SHAPE))
    python, _, _ = _rollout_ours(sched, steps, x, list(np.asarray(outs)), True)
    np.testing.assert_allclose(np.asarray(x_loop), python[-1], rtol=1e-5, atol=1e-6)


def test_add_noise_matches(rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    n = rng.standard_normal(SHAPE).astype(np.float32)
    ref = _ref(EULER)
    ref.set_timesteps(10)
    ref.set_begin_index(3)
    want = ref.scale_noise(torch.from_numpy(x), ref.timesteps[3:4], torch.from_numpy(n)).numpy()
    sched = from_config(EULER)
    got = sched.add_noise(sched.set_timesteps(10), jnp.asarray(x), jnp.asarray(n), 3)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    ref = _ref(WAN_UNIPC)
    ref.set_timesteps(10)
    want = ref.add_noise(torch.from_numpy(x), torch.from_numpy(n), ref.timesteps[4:5]).numpy()
    u = from_config(WAN_UNIPC)
    got = u.add_noise(u.set_timesteps(10, SHAPE), jnp.asarray(x), jnp.asarray(n), 4)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(add_flow_noise(jnp.asarray(x), jnp.asarray(n), 0.0)), x)


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="prediction_type='epsilon'.*flow_prediction"):
        from_config({**WAN_UNIPC, "prediction_type": "epsilon"})
    with pytest.raises(ValueError, match="solver_order=3"):
        from_config({**WAN_UNIPC, "solver_order": 3})
    with pytest.raises(ValueError, match=r"unknown keys \['flow_shfit'\]"):
        from_config({**WAN_UNIPC, "flow_shfit": 3.0})
    with pytest.raises(ValueError, match="time_shift_type='linear'"):
        from_config({**EULER, "use_dynamic_shifting": True, "time_shift_type": "linear"})
    with pytest.raises(ValueError, match="DDIMScheduler"):
        from_config({"_class_name": "DDIMScheduler"})
    with pytest.raises(ValueError, match="latent shape"):
        from_config(WAN_UNIPC).set_timesteps(10)
    st = from_config(WAN_UNIPC).set_timesteps(4, SHAPE)
    with pytest.raises(ValueError, match="must both have the shape"):
        from_config(WAN_UNIPC).step(st, jnp.zeros((2, 3)), jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="num_steps=0"):
        from_config(EULER).set_timesteps(0)
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(WAN_UNIPC))
    s = load_scheduler(tmp_path)
    assert isinstance(s, UniPCScheduler) and s.flow_shift == 3.0 and s.solver_order == 2
    assert isinstance(from_config(EULER), FlowMatchEulerScheduler)


def test_override_config():
    """sample.scheduler / flow_shift overrides: same sampler with a new shift, or another sampler
    on the flow schedule keeping the folder's num_train_timesteps and shift."""
    assert override_config(WAN_UNIPC) is WAN_UNIPC
    same = override_config(WAN_UNIPC, None, 5.0)
    assert same == {**WAN_UNIPC, "flow_shift": 5.0} and WAN_UNIPC["flow_shift"] == 3.0
    euler = override_config(WAN_UNIPC, "euler")
    assert euler == {**EULER, "shift": 3.0}
    assert isinstance(from_config(euler), FlowMatchEulerScheduler)
    unipc = from_config(override_config(EULER, "unipc", 5.0))
    assert isinstance(unipc, UniPCScheduler) and unipc.flow_shift == 5.0
    assert override_config(EULER, "euler", 2.0) == {**EULER, "shift": 2.0}
    ddim = {"_class_name": "DDIMScheduler"}
    assert override_config(ddim, None, 2.0) is ddim  # building it then names what exists
    with pytest.raises(ValueError, match="scheduler='dpm' is not one of unipc, euler"):
        override_config(WAN_UNIPC, "dpm")
