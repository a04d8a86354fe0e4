"""The demo model: VAE training (``ditax train-vae``), the recipe that trains the whole
pipeline (``make demo-model``) at toy sizes, and the shipped, trained folder."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax
from ditax.recipes.demo_model import SMOKE, STAGES, Recipe, check_manifest, write_manifest

H = W = 32
FRAMES = 5


def _first_last(losses):
    k = max(1, len(losses) // 3)
    return float(np.mean(losses[:k])), float(np.mean(losses[-k:]))


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_model")
    lines = []
    # the transformer trains on one device: these tests are about the recipe, not the mesh
    run = Recipe(out, SMOKE, seed=0, train_devices=1, say=lines.append, progress=False)
    rec = run.run()
    return out, rec, lines, run


def test_recipe_trains_both_models_and_writes_a_pipeline_folder(recipe):
    out, rec = recipe[:2]
    assert set(rec["stages"]) == set(STAGES)
    assert rec["seconds"] > 0
    vae_rows = [json.loads(x) for x in (out / "vae" / "metrics.jsonl").read_text().splitlines()]
    first, last = _first_last([r["loss"] for r in vae_rows if "loss" in r])
    assert last < first, (first, last)
    t_rows = [json.loads(x)
              for x in (out / "transformer" / "metrics.jsonl").read_text().splitlines()]
    first, last = _first_last([r["loss"] for r in t_rows])
    assert last < first, (first, last)
    for png in ("loss_vae.png", "loss_transformer.png"):
        assert (out / png).stat().st_size > 1000
    assert np.isfinite(rec["stages"]["vae"]["eval_psnr_db"])
    folder = out / "pipeline"
    assert check_manifest(folder) == []
    # the manifest notices a changed byte
    f = folder / "scheduler" / "scheduler_config.json"
    f.write_text(f.read_text() + " ")
    assert check_manifest(folder) == ["scheduler/scheduler_config.json"]
    write_manifest(folder)


def test_recipe_folder_loads_in_ditax_and_diffusers_with_the_same_video(recipe):
    import torch
    from diffusers import WanPipeline

    from pipeline_reference import run_diffusers

    folder = recipe[0] / "pipeline"
    pipe = ditax.load_pipeline(folder)
    # the folder's own text length (its ditax_sample.json) for both: diffusers' default is 512
    kw = dict(prompt="a red circle moves right", negative_prompt="", height=H, width=W,
              num_frames=FRAMES, num_inference_steps=3, guidance_scale=3.0,
              max_sequence_length=pipe.max_sequence_length)
    lat = np.random.default_rng(0).standard_normal(
        pipe.latent_shape(H, W, FRAMES)).astype(np.float32)
    got = pipe(latents=lat, progress=False, **kw)
    ref = WanPipeline.from_pretrained(folder, dtype=torch.float32)
    want = run_diffusers(ref, lat, **kw)
    assert got.shape == want.shape == (FRAMES, H, W, 3)
    assert np.abs(got - want).max() < 1e-3, np.abs(got - want).max()


def test_vae_training_resumes_bit_exactly_and_writes_a_diffusers_folder(recipe, tmp_path):
    """The recipe's second VAE stage again (from its first stage's VAE, ``init_from``; its
    trainer, so its compiled programs): one step, stop, resume to two: the same losses and
    weights as two in one go (the resumed step needs the checkpoint's weights, optimiser
    moments, learning-rate schedule position and data position to match)."""
    import copy
    import dataclasses

    from diffusers import AutoencoderKLWan

    from ditax.train.wan.vae import ClipBank, train_vae

    out = recipe[0]
    trainer = recipe[3].vae_trainers["vae_long"]
    base = trainer.cfg
    assert base.init_from == str(out / "vae" / "vae") and base.optim.decay_steps == 4
    # the long stage ran the first stage's compiled programs (another learning rate: an
    # argument of the step); a trainer whose programs would compute something else is refused
    first = recipe[3].vae_trainers["vae"]
    assert base.optim.learning_rate != first.cfg.optim.learning_rate
    assert (trainer._step, trainer._decode) == (first._step, first._decode)
    other = copy.copy(first)
    other.cfg = dataclasses.replace(first.cfg, loss=dataclasses.replace(first.cfg.loss, l1=0.5))
    with pytest.raises(ValueError, match="programs_from: that trainer's programs differ in loss"):
        trainer.share_programs(other)
    assert (base.data.crop_frames, base.data.height, base.data.width) == (FRAMES, H, W)
    quiet = dict(progress=False, say=lambda m: None)

    def cfg(steps, name):
        return dataclasses.replace(base, steps=steps, output_dir=str(tmp_path / name), log_every=1,
                                   checkpoint=dataclasses.replace(base.checkpoint, every=1))

    bank = recipe[3].vae_banks["vae_long"]      # the stage's clips, read by the recipe
    assert isinstance(bank, ClipBank) and bank.data == base.data
    a = train_vae(cfg(2, "a"), trainer=trainer, bank=bank, **quiet)
    train_vae(cfg(1, "b"), trainer=trainer, bank=bank, **quiet)
    b = train_vae(cfg(2, "b"), trainer=trainer, bank=bank, **quiet)
    assert b.resumed_from == 1 and len(b.losses) == 1
    assert a.losses[1:] == b.losses
    for x, y in zip(jax.tree.leaves(a.state["params"]), jax.tree.leaves(b.state["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # the written folder is a diffusers AutoencoderKLWan with the measured latent statistics,
    # and it reconstructs like ditax's VAE does
    ref = AutoencoderKLWan.from_pretrained(b.folder)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    np.testing.assert_allclose(ref.config.latents_std, summary["latents_std"], rtol=1e-6)
    import torch

    from ditax.train.wan.vae import to_video

    clip = to_video(bank.eval)      # the held-out clips, as the trainer's own PSNR reads them
    ours = trainer.reconstruct(b.state["params"], clip)
    with torch.no_grad():
        theirs = ref.decode(ref.encode(torch.from_numpy(clip)).latent_dist.mode()).sample
    np.testing.assert_allclose(ours, np.clip(theirs.numpy(), -1, 1), atol=1e-4)


def test_vae_training_config_errors(tmp_path):
    from ditax.cli import main

    assert main(["train-vae", "data.source=" + str(tmp_path / "nope"), "steps=1"]) == 2
    assert main(["train-vae", "data.source=x", "data.crop_frames=4"]) == 2
    assert main(["train-vae", "data.source=x", "loss.l1=0", "loss.l2=0"]) == 2
    assert main(["train-vae", "data.source=x", "vae.base_dim=oops"]) == 2


def _sparse_bank(focus: float, candidates: int = 4):
    """96x96 clips of 9 frames: dark background, one 4x4 bright square per clip."""
    from ditax.train.wan.vae_config import VAEDataConfig
    from ditax.train.wan.vae import ClipBank

    rng = np.random.default_rng(1)
    clips = np.full((40, 9, 96, 96, 3), 20, np.uint8)
    for c in clips:
        y, x = rng.integers(92, size=2)
        c[:, y:y + 4, x:x + 4] = 230
    bank = ClipBank.__new__(ClipBank)
    bank.train, bank.eval = clips, clips[:1]
    bank.data = VAEDataConfig(source="x", num_frames=9, height=96, width=96, crop_frames=9,
                              crop=32, crop_focus=focus, crop_candidates=candidates)
    return bank


def test_vae_focused_crops_oversample_the_foreground():
    def object_share(bank):
        hits = [(bank.batch(7, step, 8).max(axis=(1, 2, 3, 4)) > 0.5)
                for step in range(40)]
        return float(np.mean(hits))

    uniform, focused = object_share(_sparse_bank(0.0)), object_share(_sparse_bank(1.0, 16))
    half = object_share(_sparse_bank(0.5, 16))
    # a random 32x32 crop of 96x96 frames holds (part of) a 4x4 square about 1/4 of the time
    # (squares near a corner are in few crops: the best of 16 still misses some of them)
    assert uniform < 0.4, uniform
    assert focused > 2 * uniform and focused > 0.7, (uniform, focused)
    assert uniform + 0.1 < half < focused - 0.1, (uniform, half, focused)
    # deterministic in (seed, step); windows and clips are those of the uniform draw
    a, b = _sparse_bank(1.0, 16).batch(3, 5, 8), _sparse_bank(1.0, 16).batch(3, 5, 8)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (8, 9, 32, 32, 3)


def test_vae_focused_crop_config_errors():
    from ditax.cli import main

    assert main(["train-vae", "data.source=x", "data.crop=32", "data.crop_focus=1.5"]) == 2
    assert main(["train-vae", "data.source=x", "data.crop_focus=0.5"]) == 2   # crop 0
    assert main(["train-vae", "data.source=x", "data.crop=32",
                 "data.crop_candidates=0"]) == 2


@pytest.mark.parametrize("stride", [(1, 1, 1), (2, 1, 1), (1, 2, 2)])
@pytest.mark.parametrize("kernel", [(3, 3, 3), (3, 1, 1), (1, 1, 1)])
def test_cpu_conv3d_by_frames_equals_the_3d_convolution(kernel, stride, rng):
    """The CPU fast path of CausalConv3d against XLA's 3-D convolution, values and grads."""
    from ditax.models.vae.wan.layers import conv3d_by_frames

    x = jnp.asarray(rng.standard_normal((2, 7, 10, 12, 5)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((*kernel, 5, 6)) / 10, jnp.float32)
    pad = (kernel[1] // 2, kernel[2] // 2)

    def ref(x, w):
        return jax.lax.conv_general_dilated(
            x, w, stride, [(0, 0), (pad[0], pad[0]), (pad[1], pad[1])],
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))

    def fast(x, w):
        return conv3d_by_frames(x, w, stride, ((pad[0], pad[0]), (pad[1], pad[1])))

    np.testing.assert_allclose(fast(x, w), ref(x, w), rtol=1e-5, atol=1e-5)
    g_ref = jax.grad(lambda x, w: jnp.sum(ref(x, w) ** 2), (0, 1))(x, w)
    g_fast = jax.grad(lambda x, w: jnp.sum(fast(x, w) ** 2), (0, 1))(x, w)
    for a, b in zip(g_fast, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_text_dropout_uses_the_empty_prompt_deterministically(tmp_path):
    from ditax.config import load_config
    from ditax.train.batches import BatchIterator
    from ditax.train.data_writer import DatasetWriter

    w = DatasetWriter(tmp_path / "ds")
    r = np.random.default_rng(0)
    for _ in range(40):
        w.add(r.standard_normal((16, 2, 8, 8)).astype(np.float32),
              r.standard_normal((8, 64)).astype(np.float32) + 5.0, np.ones(8, np.uint8))
    null = (np.full((8, 64), -1.0, np.float32), np.eye(1, 8, 0, np.uint8)[0])
    w.close({}, null_text=null)
    cfg = load_config("tiny", [f"data.source={tmp_path / 'ds'}", "data.text_dropout=0.25",
                               "data.num_frames=5", "data.text_len=8", "batch_size=40"])
    batch = next(BatchIterator(cfg))
    dropped = np.all(batch["text"] == -1.0, axis=(1, 2))
    assert 3 <= dropped.sum() <= 20, dropped.sum()
    assert np.all(batch["text_mask"][dropped] == null[1])
    assert np.all(batch["text"][~dropped] > 0.0)  # the others untouched (a margin of 5 sigma)
    again = next(BatchIterator(cfg))
    np.testing.assert_array_equal(again["text"], batch["text"])


# --- the shipped model


SHIPPED = pathlib.Path(ditax.__file__).parent / "assets" / "demo_model"
needs_shipped = pytest.mark.skipif(not (SHIPPED / "model_index.json").is_file(),
                                   reason="the demo model is not in this checkout")


@needs_shipped
def test_shipped_folder_matches_its_manifest_and_size_budget():
    from ditax.demo import SAMPLE, model_path

    assert model_path() == SHIPPED
    assert check_manifest(SHIPPED) == []
    size = sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file())
    assert size <= 30 * 2 ** 20, size
    assert SAMPLE["height"] >= 64 and SAMPLE["width"] >= 64 and SAMPLE["num_frames"] >= 17


@needs_shipped
def test_shipped_model_follows_colour_and_direction_better_than_random_weights(tmp_path):
    """One prompt per vocabulary colour (seen combinations, seed 0): the trained model draws
    every colour right and the direction in at least 4 of 5 (the benchmark measures colour 95%
    and direction 98% over 105 seen videos, these five all right; one miss is slack for
    another CPU's rounding), and does better on both than the same pipeline with its
    transformer's weights shuffled."""
    from ditax.demo import SAMPLE, model_path
    from ditax.serve.batch import generate_batch
    from ditax.synthetic.score import score

    prompts = ["a red circle moves left", "a green square moves right",
               "a blue circle moves down", "a yellow square moves up",
               "a white circle moves right"]
    pipe = ditax.load_pipeline(model_path())
    # the five calls ``pipe(p, seed=0, **SAMPLE)`` as one batch through the same step program
    # (ditax serve's batching: each video equal to its own call within float rounding, 3e-5
    # here, the same scores); the folder's text length is the pipeline's default
    sample = dict(SAMPLE)
    assert sample.pop("max_sequence_length") == pipe.max_sequence_length
    calls = [dict(sample, prompt=p, seed=0, guidance_scale_2=None) for p in prompts]

    def right(pipe):
        rows = [score(v, p) for v, p in zip(generate_batch(pipe, calls), prompts)]
        return ([p for p, r in zip(prompts, rows) if r["colour_correct"]],
                [p for p, r in zip(prompts, rows) if r["direction_correct"]])

    colour, direction = right(pipe)
    # the same pipeline with each transformer weight's entries shuffled (the same statistics,
    # no learned structure; same shapes, dtypes and placement, so the compiled programs, which
    # take the weights as arguments, are reused)
    shuffle = np.random.default_rng(1).permutation

    def shuffled(x):
        y = shuffle(np.asarray(x).ravel()).reshape(x.shape)
        return jax.device_put(y, x.sharding) if x.committed else jnp.asarray(y, x.dtype)

    pipe.transformer = jax.tree.map(shuffled, pipe.transformer)
    rand_colour, rand_direction = right(pipe)
    assert len(colour) == 5, colour
    assert len(direction) >= 4, direction
    assert len(colour) > len(rand_colour), (colour, rand_colour)
    assert len(direction) > len(rand_direction), (direction, rand_direction)


@needs_shipped
def test_generate_cli_takes_the_demo_model(tmp_path):
    from ditax.cli import main

    out = tmp_path / "v.mp4"
    # 5 frames: the folder's own size is test_demo_by_path_samples_at_its_own_size's
    assert main(["generate", "--model", "demo", "--prompt", "a red square moves left",
                 "--steps", "4", "--frames", "5", "--output", str(out), "--no-progress"]) == 0
    assert out.stat().st_size > 0


@needs_shipped
def test_run_demo_writes_videos_sheet_and_scores(tmp_path):
    from ditax.demo import DEMO_PROMPTS
    from ditax.demo.run import run_demo

    # one prompt: the teacher's and the student's video of it, the sheet's two rows
    rec = run_demo(out=tmp_path, prompts=DEMO_PROMPTS[:1], say=lambda m: None)
    assert len(rec["videos"]) == len(rec["student"]["videos"]) == 1
    assert pathlib.Path(rec["sheet"]).stat().st_size > 0
    for row in rec["videos"]:
        assert pathlib.Path(row["file"]).stat().st_size > 0
    assert set(rec["score"]) == {"colour", "shape", "direction"}
    assert all(v >= 0 for v in rec["phases"].values())
