"""Training FLUX.1 through ``ditax.train``, from a tiny ``FluxPipeline`` folder: ``ditax
preprocess`` of captioned images stores what the pipeline encodes; the loss and gradient norm
equal diffusers' ``FluxTransformer2DModel`` on the same noise and timesteps (guidance
embedding, the resolution's shift, pooled text); one step on fsdp2 x context4 equals one
device; training from the folder resumes bit for bit; bad input refused in one line. Two
compiled train steps in all (one device, 8 devices)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.config import load_config
from ditax.models.flux.packing import image_ids, pack, text_ids
from ditax.parallel.mesh import make_mesh
from ditax.schedulers.flow_match import flux_mu
from ditax.train.batches import BatchIterator
from ditax.train.data import null_text, read_meta
from ditax.train.loss import sample_sigmas
from ditax.train.step import Trainer

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from flux_reference import make_tiny_flux_pipeline  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
SIZE = 32          # pixels: the tiny VAE's 2x gives 16 x 16 latents, 64 packed tokens
CAPTIONS = ["a red square", "a blue circle on the left", "two cats", "the sea"]
# the 8-device runs: fsdp 2 x context 4, ring attention over the joint sequence, full remat
MESH8 = ("mesh.fsdp=2", "mesh.context=4", "attention.backend=ring", "model.remat=full")


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    """A tiny dev-style FluxPipeline folder (guidance embedding; the TINY transformer, 1
    latent channel) and the dataset ``ditax preprocess`` writes from four captioned PNGs."""
    import PIL.Image

    from ditax.cli import main

    tmp = tmp_path_factory.mktemp("flux_train")
    pipe, folder = make_tiny_flux_pipeline(tmp, guidance_embeds=True)
    rng = np.random.default_rng(0)
    (tmp / "images").mkdir()
    for i, caption in enumerate(CAPTIONS):
        rgb = rng.uniform(0, 255, (40, 48, 3)).astype(np.uint8)    # resized to 32 x 32
        PIL.Image.fromarray(rgb).save(tmp / "images" / f"img{i}.png")
        (tmp / "images" / f"img{i}.txt").write_text(caption)
    ds = tmp / "ds"
    assert main(["preprocess", str(tmp / "images"), str(ds), "--model", str(folder),
                 "--height", str(SIZE), "--width", str(SIZE), "--text-len", "8",
                 "--batch", "1", "--resize", "stretch", "--no-progress"]) == 0   # as resize()
    return pipe, folder, ds, tmp


def _cfg(flux, *extra):
    _, folder, ds, _ = flux
    return load_config("flux-tiny", ["model.in_channels=4", f"init_from={folder}",
                                     f"data.source={ds}", "data.shuffle=false", "batch_size=2",
                                     *extra])


@pytest.fixture(scope="module")
def first_step(flux):
    """One step on one device (blocks not scanned) from the folder's transformer: (trainer,
    initial params as numpy, batch, the step's key, metrics, new state)."""
    cfg = _cfg(flux, "model.scan_layers=false")
    tr = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    state = tr.init(tr.family.load_params(tr.family.weights_folder(cfg.init_from), tr.mesh))
    params0 = jax.tree.map(np.asarray, state["params"])
    key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), 0)   # the step's key
    batch = next(BatchIterator(cfg))
    new, metrics = tr.step(state, tr.put_batch(batch))
    return tr, params0, batch, key, metrics, new


@pytest.fixture(scope="module")
def many(flux):
    """The 8-device Trainer (one compiled step for every 8-device run below)."""
    cfg = _cfg(flux, *MESH8)
    return Trainer(cfg, make_mesh(cfg.mesh))


def test_preprocess_stores_what_the_flux_pipeline_encodes(flux):
    """The dataset of captioned images: per sample the VAE's normalised posterior mean
    ``(z - shift_factor) * scaling_factor``, the T5 embeddings and the pooled CLIP vector, as
    diffusers' FluxPipeline encodes the caption and the (bicubic-resized) image."""
    import PIL.Image

    pipe, _, ds, tmp = flux
    meta = read_meta(ds)
    assert meta["latent_shape"] == [1, 1, 16, 16] and meta["text_shape"] == [8, 32]
    assert meta["condition"] == {"pooled": [32]} and meta["frames"] == 1
    sample = next(BatchIterator(load_config("flux-tiny", [
        "model.in_channels=4", f"data.source={ds}", "data.shuffle=false", "batch_size=1"])))
    with torch.no_grad():
        emb, pooled, _ = pipe.encode_prompt(CAPTIONS[0], None, max_sequence_length=8)
        img = PIL.Image.open(tmp / "images" / "img0.png").convert("RGB").resize(
            (SIZE, SIZE), PIL.Image.Resampling.BICUBIC)
        x = torch.from_numpy(np.asarray(img, np.float32).transpose(2, 0, 1)[None] / 127.5 - 1)
        z = pipe.vae.encode(x).latent_dist.mean
    z = (z - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    np.testing.assert_allclose(sample["pooled"][0], pooled[0].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sample["text"][0], emb[0].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sample["latents"][0, :, 0], z[0].numpy(), rtol=1e-4, atol=1e-4)
    # data.text_dropout swaps in the empty prompt's pooled vector with its T5 text
    with torch.no_grad():
        _, pooled_empty, _ = pipe.encode_prompt("", None, max_sequence_length=8)
    _, _, extra = null_text(load_config("flux-tiny", [f"data.source={ds}"]), (8, 32))
    np.testing.assert_allclose(extra["pooled"], pooled_empty[0].numpy(), rtol=1e-4, atol=1e-5)


def test_loss_equals_diffusers_flux_loss(flux, first_step):
    """The step's loss and gradient norm against the same flow loss written out with
    diffusers' model (the folder's transformer): x_t = (1 - σ) x0 + σ ε packed, the model fed
    σ, guidance 3.5, the pooled text and the position ids, MSE against ε - x0; σ logit-normal
    with the shift e^mu of the 64 image tokens."""
    pipe = flux[0]
    tr, _, batch, key, metrics, _ = first_step
    flow = tr.family.training_flow((1, 1, 16, 16))
    assert flow.shift == pytest.approx(math.exp(flux_mu(64))) and tr.family.guidance == 3.5
    # the draws of flow_loss: sigma from the first half of the key, noise from the second
    k_sigma, k_noise = jax.random.split(key)
    sigma = np.asarray(sample_sigmas(k_sigma, 2, flow))
    x0 = batch["latents"]
    noise = np.asarray(jax.random.normal(k_noise, x0.shape, jnp.float32))
    s = sigma[:, None, None, None, None]
    x_t, target = (1 - s) * x0 + s * noise, noise - x0
    t, ref = torch.from_numpy, pipe.transformer
    ref.zero_grad()
    out = ref(hidden_states=t(pack(x_t[:, :, 0])), encoder_hidden_states=t(batch["text"]),
              pooled_projections=t(batch["pooled"]),
              timestep=t((sigma * 1000).astype(np.float32) / np.float32(1000)),
              img_ids=t(image_ids(16, 16)), txt_ids=t(text_ids(8)),
              guidance=torch.full((2,), 3.5), return_dict=False)[0]
    want = torch.mean((out - t(pack(target[:, :, 0]))) ** 2)
    want.backward()
    want = want.detach()
    norm = float(torch.sqrt(sum(torch.sum(p.grad ** 2) for p in ref.parameters())))
    loss, got_norm = float(metrics["loss"]), float(metrics["grad_norm"])
    assert abs(loss - float(want)) <= 1e-5 * float(want), (loss, float(want))
    assert abs(got_norm - norm) <= 1e-4 * norm, (got_norm, norm)


def test_one_step_on_fsdp2_context4_equals_one_device(first_step, many):
    """Same weights and batch: one step on fsdp 2 x context 4 (ring, full remat, scanned
    blocks) gives the loss, gradient norm and update of one device (blocks unrolled)."""
    one, params0, batch, _, m1, s1 = first_step
    assert many.batch_sh["pooled"].spec == many.batch_sh["latents"].spec
    s8, m8 = many.step(many.init(params0), many.put_batch(batch))
    assert abs(float(m8["loss"]) - float(m1["loss"])) < 1e-6 * float(m1["loss"])
    assert abs(float(m8["grad_norm"]) - float(m1["grad_norm"])) < 1e-5 * float(m1["grad_norm"])
    # Adam's first update is lr * g / (|g| + eps): for the few entries whose gradient is near
    # zero it magnifies the ring's float32 rounding (up to ~1.5e-5 of lr = 1e-3 seen)
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                         s8["params"], s1["params"])
    assert max(jax.tree.leaves(diffs)) < 3e-5
    # the pooled text is used: another pooled vector, another loss
    other = dict(batch, pooled=batch["pooled"] * 0)
    _, m = many.step(many.init(params0), many.put_batch(other))
    assert abs(float(m["loss"]) - float(m1["loss"])) > 1e-4


def test_train_from_the_folder_resumes_bit_exact(flux, many):
    """``train`` from the folder's transformer (init_from) on the preprocessed images, on 8
    devices: 2 steps straight equal 1 step + a resumed 1, bit for bit."""
    from ditax.train.loop import train

    tmp = flux[3]

    def cfg(out, steps):
        return _cfg(flux, *MESH8, f"steps={steps}", f"output_dir={tmp / out}",
                    "checkpoint.every=1", "checkpoint.async_save=false", "data.shuffle=true")

    a = train(cfg("a", 2), trainer=many, progress=False)
    b1 = train(cfg("b", 1), trainer=many, progress=False)
    b2 = train(cfg("b", 2), trainer=many, progress=False)
    assert b2.resumed_from == 1 and a.losses == b1.losses + b2.losses
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b2.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("argv,words", [
    (["train", "flux.1-schnell", "flow.guidance=3.5"], "no guidance embedding"),
    (["train", "flux.1-dev", "flow.shift=3"], "flow.dynamic_shift=true"),
    (["train", "flux-tiny", "data.height=40"], "height=40 must be a positive multiple of 16"),
])
def test_bad_flux_training_input_is_one_line(argv, words, capsys, tmp_path):
    from ditax.cli import main

    rc = main(argv + [f"output_dir={tmp_path / 'run'}", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err
