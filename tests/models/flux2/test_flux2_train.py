"""Training FLUX.2 through ``ditax.train`` (``init_from`` a diffusers transformer folder,
synthetic latents): the loss and gradient norm equal the flow loss written out with diffusers'
``Flux2Transformer2DModel`` (tokens of the latents, the 4-axis ids, σ as the timestep, the
guidance input of a guidance-embedding model), and one step on fsdp2 x context4 (ring, full
remat, scanned blocks) equals one device (blocks unrolled). Two compiled train steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ditax.config import load_config
from ditax.parallel.mesh import make_mesh
from ditax.train.batches import BatchIterator
from ditax.train.loss import sample_sigmas
from ditax.train.step import Trainer
from flux2_reference import TINY, make_diffusers_flux2

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
MESH8 = ("mesh.fsdp=2", "mesh.context=4", "attention.backend=ring", "model.remat=full")
CFG = dict(TINY, in_channels=8, num_attention_heads=4)    # dev-like: guidance embedded
SIZE, TEXT, GUIDANCE = 64, 8, 1.5                          # 4 x 4 tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux2_train")
    m, _ = make_diffusers_flux2(root, seed=3, name="transformer", **CFG)
    return m, root


def _cfg(folder, *extra):
    from ditax.models.flux2.family import Flux2Family

    return load_config(None, [f"init_from={folder[1]}", "data.source=synthetic",
                              f"data.height={SIZE}", f"data.width={SIZE}", "data.num_frames=1",
                              f"data.text_len={TEXT}", "batch_size=2",
                              "optim.learning_rate=1e-3", "flow.timestep_sampler=logit_normal",
                              f"flow.guidance={GUIDANCE}", *extra],
                       family="flux2", model=Flux2Family.folder_config(folder[1]))


@pytest.fixture(scope="module")
def first_step(folder):
    cfg = _cfg(folder, "model.scan_layers=false")
    tr = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    state = tr.init(tr.family.load_params(tr.family.weights_folder(cfg.init_from), tr.mesh))
    params0 = jax.tree.map(np.asarray, state["params"])
    key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), 0)   # the step's key
    batch = next(BatchIterator(cfg))
    new, metrics = tr.step(state, tr.put_batch(batch))
    return tr, params0, batch, key, metrics, new


def test_loss_equals_diffusers_flux2_loss(folder, first_step):
    """x_t = (1 - σ) x0 + σ ε as tokens [B, Y·X, C], the model fed σ, ids (0, row, col, 0)
    and (0, 0, 0, token), guidance 1.5; MSE against ε - x0."""
    from ditax.models.flux2.training import image_ids, pack, text_ids

    ref = folder[0]
    tr, _, batch, key, metrics, _ = first_step
    assert tr.family.guidance == GUIDANCE and tr.family.latent_shape(1, SIZE, SIZE) == (8, 1, 4, 4)
    k_sigma, k_noise = jax.random.split(key)
    sigma = np.asarray(sample_sigmas(k_sigma, 2, tr.family.training_flow((8, 1, 4, 4))))
    x0 = batch["latents"]
    noise = np.asarray(jax.random.normal(k_noise, x0.shape, jnp.float32))
    s = sigma[:, None, None, None, None]
    x_t, target = (1 - s) * x0 + s * noise, noise - x0
    t = torch.from_numpy
    ref.zero_grad()
    out = ref(hidden_states=t(np.asarray(pack(x_t[:, :, 0]))),
              encoder_hidden_states=t(np.asarray(batch["text"])),
              timestep=t((sigma * 1000).astype(np.float32) / np.float32(1000)),
              img_ids=t(image_ids(4, 4)), txt_ids=t(text_ids(TEXT)),
              guidance=torch.full((2,), GUIDANCE), return_dict=False)[0]
    want = torch.mean((out - t(np.asarray(pack(target[:, :, 0])))) ** 2)
    want.backward()
    norm = float(torch.sqrt(sum(torch.sum(p.grad ** 2) for p in ref.parameters())))
    loss, got_norm = float(metrics["loss"]), float(metrics["grad_norm"])
    want = float(want.detach())
    print("flux2 loss / grad norm (ours, diffusers)", (loss, want), (got_norm, norm))
    assert abs(loss - want) <= 1e-5 * want, (loss, want)
    assert abs(got_norm - norm) <= 1e-4 * norm, (got_norm, norm)


def test_one_step_on_fsdp2_context4_equals_one_device(folder, first_step):
    """Same weights and batch: one step on fsdp 2 x context 4 (ring over the joint sequence,
    full remat, scanned blocks) gives the loss, gradient norm and update of one device."""
    _, params0, batch, _, m1, s1 = first_step
    cfg = _cfg(folder, *MESH8)
    many = Trainer(cfg, make_mesh(cfg.mesh))
    s8, m8 = many.step(many.init(params0), many.put_batch(batch))
    assert abs(float(m8["loss"]) - float(m1["loss"])) < 1e-6 * float(m1["loss"])
    assert abs(float(m8["grad_norm"]) - float(m1["grad_norm"])) < 1e-5 * float(m1["grad_norm"])
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                         s8["params"], s1["params"])
    print("flux2 8-device step: max |param diff|", max(jax.tree.leaves(diffs)))
    assert max(jax.tree.leaves(diffs)) < 3e-5


def test_preprocess_stores_what_diffusers_prepares(tmp_path):
    """``ditax preprocess`` of captioned images with a klein folder stores, per sample, the
    latents diffusers' training script makes (``vae.encode(x).latent_dist.mode()``,
    ``_patchify_latents``, ``(z - bn.running_mean) / sqrt(bn.running_var + eps)``) and the
    pipeline's ``encode_prompt`` embeddings (Qwen3 layers 9, 18, 27)."""
    import contextlib
    import io

    import PIL.Image
    from diffusers import Flux2KleinPipeline

    from ditax.cli import main
    from ditax.train.data import read_meta
    from flux2_pipeline_reference import shared_klein_folder
    from wan_reference import rel_err

    folder, size, text = shared_klein_folder(), 32, 32
    (tmp_path / "images").mkdir()
    rgb = np.random.default_rng(0).uniform(0, 255, (size, size, 3)).astype(np.uint8)
    PIL.Image.fromarray(rgb).save(tmp_path / "images" / "img0.png")
    (tmp_path / "images" / "img0.txt").write_text("a red fox in the snow")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["preprocess", str(tmp_path / "images"), str(tmp_path / "ds"), "--model",
                     str(folder), "--height", str(size), "--width", str(size), "--text-len",
                     str(text), "--batch", "1", "--no-progress"]) == 0
    pipe = Flux2KleinPipeline.from_pretrained(folder)
    c = pipe.transformer.config.in_channels
    assert read_meta(tmp_path / "ds")["latent_shape"] == [c, 1, size // 4, size // 4]   # VAE 2x
    from ditax.models.flux2.family import Flux2Family

    sample = next(BatchIterator(load_config(None, [
        f"data.source={tmp_path / 'ds'}", "batch_size=1", f"data.text_len={text}",
        f"data.height={size}", f"data.width={size}", "data.num_frames=1"], family="flux2",
        model=Flux2Family.folder_config(folder))))
    with torch.no_grad():
        x = torch.from_numpy(rgb.astype(np.float32).transpose(2, 0, 1)[None] / 127.5 - 1)
        z = pipe._patchify_latents(pipe.vae.encode(x).latent_dist.mode())
        std = torch.sqrt(pipe.vae.bn.running_var + pipe.vae.config.batch_norm_eps)
        z = (z - pipe.vae.bn.running_mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
        emb, _ = pipe.encode_prompt("a red fox in the snow", max_sequence_length=text)
    errs = (rel_err(sample["latents"][0, :, 0], z[0].numpy()),
            rel_err(sample["text"][0], emb[0].numpy()))
    print("flux2 preprocess rel err (latents, text)", errs)
    assert max(errs) <= 1e-5, errs
