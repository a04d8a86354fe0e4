"""Text-to-video pipeline vs diffusers' WanPipeline on tiny random components (same initial
latents): UniPC and Euler, batched and sequential CFG, Wan 2.2 two-expert switching, an 8-device
mesh, no recompilation between steps or calls, bad requests and broken folders."""

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.config import AttentionConfig  # noqa: E402
from ditax.errors import DitaxError  # noqa: E402
from ditax.parallel import make_mesh  # noqa: E402
from ditax.pipelines.wan.text_to_video import PipelineLoadError  # noqa: E402
from compiles import compiles  # noqa: E402
from pipeline_reference import make_tiny_pipeline, run_diffusers  # noqa: E402

STEP = "_denoise_step"  # the pipeline's jitted sampling step (one compiled program per shape)

H = W = 32
FRAMES = 5
REQ = dict(prompt="a cat walks on the grass", negative_prompt="blurry, low quality",
           height=H, width=W, num_frames=FRAMES)
TOL = 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ref, folder = make_tiny_pipeline(tmp_path_factory.mktemp("t2v"))
    return ref, folder, ditax.load_pipeline(folder)


def _latents(pipe, seed):
    return np.random.default_rng(seed).standard_normal(
        pipe.latent_shape(H, W, FRAMES)).astype(np.float32)


def test_matches_diffusers_with_cfg_and_compiles_once(tiny):
    ref, _, pipe = tiny
    lat = _latents(pipe, 1)
    kw = dict(REQ, num_inference_steps=4, guidance_scale=5.0)
    with compiles() as first:
        got = pipe(latents=lat, progress=False, **kw)
    assert got.shape == (FRAMES, H, W, 3) and got.dtype == np.float32
    assert 0.0 <= got.min() and got.max() <= 1.0
    want = run_diffusers(ref, lat, **kw)
    assert np.abs(got - want).max() < TOL, np.abs(got - want).max()
    assert got.std() > 1e-3  # a real video, not a constant
    assert first.count(STEP) <= 1, first.names  # 4 steps, one program
    # another prompt, seed and guidance: still the same compiled step (a new step count
    # would compile once more: the scheduler's tables are [N]-shaped)
    with compiles() as again:
        other = pipe(prompt="a red car", height=H, width=W, num_frames=FRAMES,
                     num_inference_steps=4, guidance_scale=3.0, seed=7, progress=False)
    assert again.count(STEP) == 0, again.names
    assert np.abs(other - got).max() > 1e-3
    for name in ("text", "denoise", "decode"):
        assert getattr(pipe.timings, name) > 0


def test_sequential_cfg_equals_batched(tiny):
    _, _, pipe = tiny
    lat = _latents(pipe, 2)
    # 4 steps, as test_matches_diffusers_with_cfg_and_compiles_once: the batched step is reused
    kw = dict(REQ, num_inference_steps=4, guidance_scale=4.0, latents=lat, progress=False)
    batched = pipe(**kw)
    pipe.cfg_mode = "sequential"
    try:
        seq = pipe(**kw)
    finally:
        pipe.cfg_mode = "batched"
    np.testing.assert_allclose(seq, batched, atol=1e-5)


def test_seed_gives_reproducible_noise(tiny):
    _, _, pipe = tiny
    kw = dict(REQ, num_inference_steps=4, guidance_scale=5.0, progress=False, output="latent")
    a, b = pipe(seed=3, **kw), pipe(seed=3, **kw)
    np.testing.assert_array_equal(a, b)
    assert np.abs(pipe(seed=4, **kw) - a).max() > 1e-3


def test_euler_scheduler_matches_diffusers(tmp_path):
    ref, folder = make_tiny_pipeline(tmp_path, scheduler="euler")
    pipe = ditax.load_pipeline(folder)
    assert type(pipe.scheduler).__name__ == "FlowMatchEulerScheduler"
    lat = _latents(pipe, 3)
    kw = dict(REQ, num_inference_steps=3, guidance_scale=3.5)
    got = pipe(latents=lat, progress=False, **kw)
    want = run_diffusers(ref, lat, **kw)
    assert np.abs(got - want).max() < TOL


def test_two_experts_switch_like_diffusers(tmp_path):
    """Wan 2.2 A14B layout: transformer (high noise) / transformer_2 (low noise) split at
    boundary_ratio * 1000, each with its own guidance scale."""
    ref, folder = make_tiny_pipeline(tmp_path, two_experts=True, boundary_ratio=0.8)
    pipe = ditax.load_pipeline(folder)
    assert pipe.transformer_2 is not None and pipe.boundary_ratio == 0.8
    lat = _latents(pipe, 4)
    kw = dict(REQ, num_inference_steps=4, guidance_scale=4.0, guidance_scale_2=2.0)
    t = np.asarray(pipe.scheduler.set_timesteps(4, lat.shape).timesteps)
    assert (t >= 800).any() and (t < 800).any()  # both experts really run
    with compiles() as log:
        got = pipe(latents=lat, progress=False, **kw)
    assert log.count(STEP) <= 1, log.names  # both experts share the compiled step
    want = run_diffusers(ref, lat, **kw)
    assert np.abs(got - want).max() < TOL
    # the low-noise expert matters: dropping it changes the result
    pipe.transformer_2, saved = pipe.transformer, pipe.transformer_2
    try:
        single = pipe(latents=lat, progress=False, **kw)
    finally:
        pipe.transformer_2 = saved
    assert np.abs(single - got).max() > 1e-3


def test_mesh_equals_single_device(tiny):
    """fsdp=2 (cond/uncond batch) × context=4 (sequence) on 8 devices, Ulysses attention."""
    _, folder, single = tiny
    mesh = make_mesh({"fsdp": 2, "context": 4})
    pipe = ditax.load_pipeline(folder, mesh=mesh, attention=AttentionConfig(backend="ulysses"))
    k = pipe.transformer.module.blocks.attn1.to_q.kernel[...]
    assert k.sharding.shard_shape(k.shape) != k.shape  # parameters really sharded
    lat = _latents(single, 5)
    # 4 steps: the single-device step is the one compiled above
    kw = dict(REQ, num_inference_steps=4, guidance_scale=5.0, latents=lat, progress=False)
    np.testing.assert_allclose(pipe(**kw), single(**kw), atol=1e-5)


@pytest.mark.parametrize("change,match", [
    (dict(height=40), "height=40 must be a positive multiple of 16"),
    (dict(width=0), "width=0"),
    (dict(num_frames=6), r"num_frames=6 must be of the form 4k\+1.*use 5 or 9"),
    (dict(num_inference_steps=0), "num_inference_steps=0"),
    (dict(guidance_scale=-1.0), "guidance_scale=-1.0 must be"),
    (dict(prompt="   "), "prompt is empty"),
    (dict(guidance_scale_2=2.0), "guidance_scale_2 applies only to two-expert"),
    (dict(latents=np.zeros((1, 4, 3, 4, 4), np.float32)), r"latents shape \(1, 4, 3, 4, 4\)"),
    (dict(reference_images=[np.zeros((8, 8, 3))]),
     r"reference_images= is a VACE control input; this WanTextToVideo .*load a VACE folder"),
    (dict(conditioning_scale=0.5), r"conditioning_scale= is a VACE control input"),
])
def test_bad_requests(tiny, change, match):
    _, _, pipe = tiny
    kw = dict(REQ, num_inference_steps=2, guidance_scale=5.0, progress=False)
    kw.update(change)
    with pytest.raises(DitaxError, match=match):
        pipe(**kw)


def _edit_json(path, **upd):
    d = json.loads(path.read_text())
    d.update(upd)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("breakage,match", [
    ("no_vae_dir", r"lists 'vae' but the folder .*vae is missing"),
    ("no_text_encoder_entry", "has no 'text_encoder' component"),
    ("no_model_index", "model_index.json"),
    ("transformer_shape", r"shape|heads"),
    ("vae_z_dim", r"vae|z_dim|shape"),
    ("text_dim_mismatch", r"d_model=.* != transformer text_dim|shape"),
])
def test_broken_folders(tiny, tmp_path, breakage, match):
    _, folder, _ = tiny
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    if breakage == "no_vae_dir":
        shutil.rmtree(bad / "vae")
    elif breakage == "no_text_encoder_entry":
        idx = json.loads((bad / "model_index.json").read_text())
        del idx["text_encoder"]
        (bad / "model_index.json").write_text(json.dumps(idx))
    elif breakage == "no_model_index":
        (bad / "model_index.json").unlink()
    elif breakage == "transformer_shape":
        _edit_json(bad / "transformer" / "config.json", ffn_dim=80)
    elif breakage == "vae_z_dim":
        _edit_json(bad / "vae" / "config.json", z_dim=8, latents_mean=[0.0] * 8,
                   latents_std=[1.0] * 8)
    elif breakage == "text_dim_mismatch":
        _edit_json(bad / "text_encoder" / "config.json", d_model=48)
    with pytest.raises((PipelineLoadError, ValueError, KeyError, FileNotFoundError),
                       match=match):
        ditax.load_pipeline(bad)


def test_not_a_folder_nor_hub_id(tmp_path):
    with pytest.raises(PipelineLoadError, match="neither an existing folder nor a hub id"):
        ditax.load_pipeline(str(tmp_path / "nope" / "deeper" / "x"))
