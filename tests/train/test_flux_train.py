"""Training FLUX.1 through ``ditax.train``: the loss equals diffusers' ``FluxTransformer2DModel``
loss on the same noise and timesteps (guidance embedding, the resolution's shift, pooled text);
one step on fsdp2 x context4 equals one device; ``ditax preprocess`` of captioned images with a
tiny ``FluxPipeline`` folder, then training from its transformer, resumed bit for bit; bad
input refused in one line."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.config import load_config
from ditax.models.flux.packing import image_ids, pack, text_ids
from ditax.parallel.mesh import make_mesh
from ditax.schedulers.flow_match import flux_mu
from ditax.train.data import BatchIterator, read_meta
from ditax.train.loss import sample_sigmas
from ditax.train.step import Trainer

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from flux_reference import TINY, make_diffusers_flux, make_tiny_flux_pipeline  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
# the flux-tiny preset at the tiny diffusers models' shape: 1 latent channel (4 packed)
TINY_OVERRIDES = ("model.in_channels=4", "data.height=64", "data.width=64", "data.text_len=7",
                  "batch_size=2")


def _one_device(cfg):
    return Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))


def test_loss_equals_diffusers_flux_loss(tmp_path):
    """ditax's loss (and its gradient of the input and output projections) against the same
    flow loss written out with diffusers' model: x_t = (1 - σ) x0 + σ ε packed, the model fed
    σ, guidance 3.5, pooled text and the position ids, MSE against ε - x0."""
    ref, folder = make_diffusers_flux(tmp_path, 3, "tr", **TINY, guidance_embeds=True)
    cfg = load_config("flux-tiny", [*TINY_OVERRIDES, f"init_from={folder}"])
    tr = _one_device(cfg)
    params = tr.family.load_params(tr.family.weights_folder(folder), tr.mesh)
    batch = next(BatchIterator(cfg))
    assert batch["latents"].shape == (2, 1, 1, 8, 8) and batch["pooled"].shape == (2, 32)
    key = jax.random.PRNGKey(11)
    loss, grads = jax.jit(jax.value_and_grad(tr.loss_fn))(params, tr.put_batch(batch), key)

    # the draws of flow_loss: sigma from the first half of the key, noise from the second
    flow = tr.family.training_flow((1, 1, 8, 8))
    assert flow.shift == pytest.approx(math.exp(flux_mu(16)))     # 16 packed tokens
    k_sigma, k_noise = jax.random.split(key)
    sigma = np.asarray(sample_sigmas(k_sigma, 2, flow))
    x0 = batch["latents"]
    noise = np.asarray(jax.random.normal(k_noise, x0.shape, jnp.float32))
    s = sigma[:, None, None, None, None]
    x_t, target = (1 - s) * x0 + s * noise, noise - x0
    t = torch.from_numpy
    out = ref(hidden_states=t(pack(x_t[:, :, 0])), encoder_hidden_states=t(batch["text"]),
              pooled_projections=t(batch["pooled"]),
              timestep=t((sigma * 1000).astype(np.float32) / np.float32(1000)),
              img_ids=t(image_ids(8, 8)), txt_ids=t(text_ids(7)),
              guidance=torch.full((2,), 3.5), return_dict=False)[0]
    want = torch.mean((out - t(pack(target[:, :, 0]))) ** 2)
    want.backward()
    want = want.detach()
    assert abs(float(loss) - float(want)) <= 1e-5 * float(want), (float(loss), float(want))
    for name in ("x_embedder", "proj_out"):
        got = np.asarray(grads[name]["kernel"]).T
        ref_grad = getattr(ref, name).weight.grad.numpy()
        err = np.abs(got - ref_grad).max() / np.abs(ref_grad).max()
        assert err < 1e-4, (name, err)


def test_one_step_on_fsdp2_context4_equals_one_device():
    """Same weights and batch: one step on (fsdp 2, context 4, ring over the joint sequence,
    full remat) gives the loss and update of one device without scanning the blocks."""
    cfg = load_config("flux-tiny", [*TINY_OVERRIDES, "model.scan_layers=false"])
    one = _one_device(cfg)
    batch = next(BatchIterator(cfg))
    init = one.init()
    params0 = jax.tree.map(np.asarray, init["params"])
    s1, m1 = one.step(init, one.put_batch(batch))
    mcfg = load_config("flux-tiny", [*TINY_OVERRIDES, "attention.backend=ring",
                                     "model.remat=full"])
    many = Trainer(mcfg, make_mesh({**ONE, "fsdp": 2, "context": 4}))
    assert many.batch_sh["pooled"].spec == many.batch_sh["latents"].spec
    s8, m8 = many.step(many.init(params0), many.put_batch(batch))
    assert abs(float(m8["loss"]) - float(m1["loss"])) < 1e-6 * float(m1["loss"])
    assert abs(float(m8["grad_norm"]) - float(m1["grad_norm"])) < 1e-6 * float(m1["grad_norm"])
    # Adam's first update is lr * g / (|g| + eps): for the few entries whose gradient is near
    # zero it magnifies the ring's float32 rounding (to_k: 1.5e-5 of lr = 1e-3); all other
    # entries agree to ~1e-6
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                         s8["params"], s1["params"])
    assert max(jax.tree.leaves(diffs)) < 3e-5
    # the pooled text is used: another pooled vector, another loss
    other = dict(batch, pooled=batch["pooled"] * 0)
    _, m = one.step(one.init(params0), one.put_batch(other))
    assert abs(float(m["loss"]) - float(m1["loss"])) > 1e-4


def _write_images(folder, n=4):
    import PIL.Image

    rng = np.random.default_rng(0)
    folder.mkdir()
    for i in range(n):
        rgb = (rng.uniform(0, 255, (40, 48, 3))).astype(np.uint8)    # resized to 32 x 32
        PIL.Image.fromarray(rgb).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(f"a picture number {i}")


def test_preprocess_images_then_train_and_resume_bit_exact(tmp_path, capsys):
    """``ditax preprocess`` on captioned PNGs with a tiny FluxPipeline folder (its VAE's
    normalised latents, T5 text, CLIP pooled vectors as the pipeline encodes them), then
    ``train`` from its transformer on fsdp2 x context4: 4 steps straight equal 2 steps + a
    resumed 2, bit for bit."""
    from ditax.cli import main
    from ditax.train.loop import train

    pipe, folder = make_tiny_flux_pipeline(tmp_path, guidance_embeds=True)
    _write_images(tmp_path / "images")
    ds = tmp_path / "ds"
    assert main(["preprocess", str(tmp_path / "images"), str(ds), "--model", str(folder),
                 "--height", "32", "--width", "32", "--text-len", "8", "--batch", "2",
                 "--no-progress"]) == 0
    meta = read_meta(ds)
    assert meta["latent_shape"] == [1, 1, 16, 16] and meta["text_shape"] == [8, 32]
    assert meta["condition"] == {"pooled": [32]} and meta["frames"] == 1
    sample = next(BatchIterator(load_config("flux-tiny", [
        "model.in_channels=4", f"data.source={ds}", "data.shuffle=false", "batch_size=1"])))
    # what diffusers' FluxPipeline encodes for the first caption and image
    with torch.no_grad():
        emb, pooled, _ = pipe.encode_prompt("a picture number 0", None, max_sequence_length=8)
    np.testing.assert_allclose(sample["pooled"][0], pooled[0].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sample["text"][0], emb[0].numpy(), rtol=1e-4, atol=1e-5)
    import PIL.Image

    img = PIL.Image.open(tmp_path / "images" / "img0.png").convert("RGB").resize(
        (32, 32), PIL.Image.Resampling.BICUBIC)
    x = torch.from_numpy(np.asarray(img, np.float32).transpose(2, 0, 1)[None] / 127.5 - 1)
    with torch.no_grad():
        z = pipe.vae.encode(x).latent_dist.mean
    z = (z - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    np.testing.assert_allclose(sample["latents"][0, :, 0], z[0].numpy(), rtol=1e-4, atol=1e-4)

    def cfg(out, steps):
        return load_config("flux-tiny", [
            "model.in_channels=4", f"init_from={folder}", f"data.source={ds}", "batch_size=2",
            f"steps={steps}", f"output_dir={out}", "checkpoint.every=2",
            "checkpoint.async_save=false", "mesh.fsdp=2", "mesh.context=4",
            "attention.backend=ring"])

    trainer = Trainer(cfg(tmp_path / "a", 4), make_mesh(cfg(tmp_path / "a", 4).mesh))
    a = train(cfg(tmp_path / "a", 4), trainer=trainer, progress=False)
    b1 = train(cfg(tmp_path / "b", 2), trainer=trainer, progress=False)
    b2 = train(cfg(tmp_path / "b", 4), trainer=trainer, progress=False)
    assert b2.resumed_from == 2 and a.losses == b1.losses + b2.losses
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b2.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("argv,words", [
    (["train", "flux.1-schnell", "flow.guidance=3.5"], "no guidance embedding"),
    (["train", "flux.1-dev", "flow.shift=3"], "flow.dynamic_shift=true"),
    (["train", "flux-tiny", "data.height=40"], "multiples of 16"),
])
def test_bad_flux_training_input_is_one_line(argv, words, capsys, tmp_path):
    from ditax.cli import main

    rc = main(argv + [f"output_dir={tmp_path / 'run'}", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err
