"""``sample.preset=lightning-4step``: the schedule of the 4-step distillation LoRAs (Euler,
flow shift 5, sigmas 1, 0.75, 0.5, 0.25, no guidance). Its timesteps / sigmas equal diffusers'
``FlowMatchEulerDiscreteScheduler(shift=5).set_timesteps(sigmas=...)`` and LightX2V's
published 1000, 937.5, 833.3, 625; the config loader applies it under explicit overrides; a
Wan 2.2 two-expert pipeline sampled with it equals diffusers' with the same schedule."""

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.cli import main  # noqa: E402
from ditax.config import ConfigError, load_config, validate  # noqa: E402
from ditax.pipelines.wan.defaults import SAMPLE_PRESETS  # noqa: E402
from ditax.errors import RequestError  # noqa: E402
from ditax.schedulers import from_config, override_config  # noqa: E402
from pipeline_reference import make_tiny_pipeline, run_diffusers  # noqa: E402

PRESET = ["sample.preset=lightning-4step"]
UNIPC = {"_class_name": "UniPCMultistepScheduler", "num_train_timesteps": 1000,
         "prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0}


def test_preset_values_and_override_order():
    s = validate(load_config(None, PRESET)).sample
    assert (s.num_inference_steps, s.guidance_scale, s.scheduler, s.flow_shift, s.sigmas) == \
        (4, 1.0, "euler", 5.0, (1.0, 0.75, 0.5, 0.25))
    # over a YAML's sample section (the 14B preset says 50 steps, guidance 5) ...
    big = load_config("wan2.1-t2v-14b", PRESET).sample
    assert (big.num_inference_steps, big.guidance_scale, big.height) == (4, 1.0, 720)
    # ... under the overrides given beside it, in any order
    s = load_config(None, ["sample.flow_shift=3", *PRESET]).sample
    assert (s.flow_shift, s.num_inference_steps) == (3.0, 4)
    s = load_config(None, [*PRESET, "sample.sigmas=1,0.5", "sample.num_inference_steps=2"])
    assert validate(s).sample.sigmas == (1.0, 0.5)


@pytest.mark.parametrize("overrides,match", [
    (["sample.preset=lightning-4stp"], r"sample\.preset='lightning-4stp'.*lightning-4step"),
    ([*PRESET, "sample.scheduler=unipc"], r"sample\.sigmas is for the Euler sampler"),
    ([*PRESET, "sample.num_inference_steps=8"], r"sigmas has 4 values but 8 steps"),
    (["sample.scheduler=euler", "sample.num_inference_steps=2", "sample.sigmas=0.5,0.9"],
     r"must decrease strictly"),
])
def test_preset_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(load_config(None, overrides))


def test_timesteps_equal_diffusers_and_lightx2v():
    s = load_config(None, PRESET).sample
    ours = from_config(override_config(UNIPC, s.scheduler, s.flow_shift))
    state = ours.set_timesteps(s.num_inference_steps, sigmas=s.sigmas)
    ref = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=s.flow_shift)
    ref.set_timesteps(s.num_inference_steps, sigmas=list(s.sigmas))
    np.testing.assert_array_equal(np.asarray(state.timesteps), ref.timesteps.numpy())
    np.testing.assert_array_equal(np.asarray(state.sigmas), ref.sigmas.numpy())
    np.testing.assert_allclose(np.asarray(state.timesteps), [1000.0, 937.5, 833.3333, 625.0],
                               rtol=1e-6)
    # the even spacing of the same sampler would be a different schedule
    assert np.abs(np.asarray(ours.set_timesteps(4).timesteps) - ref.timesteps.numpy()).max() > 50
    with pytest.raises(ValueError, match="sigmas has 4 values but 3 steps"):
        ours.set_timesteps(3, sigmas=s.sigmas)


def test_two_expert_pipeline_with_the_preset_equals_diffusers(tmp_path):
    """Wan 2.2 A14B layout (boundary 875): two steps per expert, guidance off."""
    ref, folder = make_tiny_pipeline(tmp_path, two_experts=True, boundary_ratio=0.875)
    s = load_config(None, PRESET).sample
    ref.scheduler = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000,
                                                              shift=s.flow_shift)
    ref.scheduler.set_timesteps = functools.partial(ref.scheduler.set_timesteps,
                                                    sigmas=list(s.sigmas))
    pipe = ditax.load_pipeline(folder, scheduler=s.scheduler, flow_shift=s.flow_shift)
    t = np.asarray(pipe.scheduler.set_timesteps(4, sigmas=s.sigmas).timesteps)
    assert (t >= 875).sum() == 2 and (t < 875).sum() == 2
    kw = dict(prompt="a cat walks on the grass", height=32, width=32, num_frames=5,
              num_inference_steps=s.num_inference_steps, guidance_scale=s.guidance_scale)
    lat = np.random.default_rng(5).standard_normal(pipe.latent_shape(32, 32, 5))
    lat = lat.astype(np.float32)
    got = pipe(latents=lat, progress=False, sigmas=s.sigmas, **kw)
    want = run_diffusers(ref, lat, **kw)
    assert np.abs(got - want).max() < 1e-3
    plain = pipe(latents=lat, progress=False, **kw)  # evenly spaced: another video
    assert np.abs(plain - got).max() > 1e-3
    unipc = ditax.load_pipeline(folder)
    with pytest.raises(RequestError, match="sigmas= needs the Euler sampler"):
        unipc(latents=lat, progress=False, sigmas=s.sigmas, **kw)


def test_generate_reads_the_preset(tmp_path):
    """``ditax generate ... sample.preset=lightning-4step`` asks the pipeline for the Euler
    sampler with shift 5 and calls it with the preset's steps, guidance and sigmas."""
    from ditax.cli import build_parser
    from ditax.cli.generate import parse_request

    (tmp_path / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    _, parser, _ = build_parser("generate")
    args = parser.parse_intermixed_args(["--model", str(tmp_path), "--prompt", "a cat",
                                         *PRESET])
    req = parse_request(args)
    load, call = req.load.kwargs(), req.call
    assert (load["scheduler"], load["flow_shift"]) == ("euler", 5.0)
    assert (call["num_inference_steps"], call["guidance_scale"], call["sigmas"]) == \
        (4, 1.0, (1.0, 0.75, 0.5, 0.25))
    req = parse_request(parser.parse_intermixed_args(
        ["--model", str(tmp_path), "--prompt", "a cat"]))
    load, call = req.load.kwargs(), req.call
    assert load["scheduler"] is None and call["sigmas"] is None


def test_generate_refuses_steps_that_do_not_fit_the_preset(tmp_path, capsys):
    (tmp_path / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "a cat", "--steps", "8",
               "--output", str(tmp_path / "o.mp4"), *PRESET])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "sigmas has 4 values" in err[0], err
    assert set(SAMPLE_PRESETS) == {"lightning-4step"}
