"""Training LTX-2 through ``ditax.train`` on both streams, from a tiny ``LTX2Pipeline`` folder:
``ditax preprocess`` of clips with sound stores what diffusers' VAEs and the LTX-2 trainer's
log-mel give (a clip without sound left out in one line); the loss (video + audio velocity
errors at one sigma), its two terms and the gradient norm equal the same loss written out with
diffusers' ``LTX2VideoTransformer3DModel`` on the same noise; one step on fsdp2 x context4
equals one device; training resumes bit for bit; LoRA training writes adapters that load back;
bad input refused in one line. Three compiled train steps in all (one device, 8 devices,
LoRA on one device)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.config import load_config
from ditax.parallel.mesh import make_mesh
from ditax.train.batches import BatchIterator
from ditax.train.data import read_meta
from ditax.train.loss import sample_sigmas
from ditax.train.step import Trainer

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from ltx2_train_reference import flow_loss, write_clips, write_ltx2_train_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
FRAMES, H, W, TEXT = 5, 16, 24, 16         # latents 2 x 2 x 3 (12 tokens), 5 audio tokens
CAPTIONS = ["a dog barks at the sea", "rain on a window", "a silent film", "a bell rings"]
SOUND = [True, True, False, True]          # clip2 has no sound track: left out
MESH8 = ("mesh.fsdp=2", "mesh.context=4", "attention.backend=ring", "model.remat=full")


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory):
    """The folder, its diffusers pipeline and transformer, and the dataset ``ditax
    preprocess`` writes from the four clips (and what it printed)."""
    import contextlib
    import io

    from ditax.cli import main

    tmp = tmp_path_factory.mktemp("ltx2_train")
    pipe, transformer = write_ltx2_train_folder(tmp / "pipe")
    write_clips(tmp / "clips", CAPTIONS, SOUND, FRAMES, H, W)
    ds, out = tmp / "ds", io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["preprocess", str(tmp / "clips"), str(ds), "--model", str(tmp / "pipe"),
                   "--height", str(H), "--width", str(W), "--frames", str(FRAMES),
                   "--text-len", str(TEXT), "--batch", "2", "--no-progress"])
    assert rc == 0, out.getvalue()
    return dict(pipe=pipe, transformer=transformer, folder=tmp / "pipe", ds=ds, tmp=tmp,
                said=out.getvalue())


def _cfg(ltx2, *extra):
    from ditax.models.ltx2.family import LTX2Family

    return load_config(None, [f"init_from={ltx2['folder']}", f"data.source={ltx2['ds']}",
                              "data.shuffle=false", "batch_size=2", "optim.learning_rate=1e-3",
                              "flow.timestep_sampler=logit_normal", "flow.dynamic_shift=true",
                              *extra],
                       family="ltx2", model=LTX2Family.folder_config(ltx2["folder"]))


@pytest.fixture(scope="module")
def first_step(ltx2):
    """One step on one device (blocks unrolled) from the folder's transformer: (trainer,
    initial params as numpy, batch, the step's key, metrics, new state)."""
    cfg = _cfg(ltx2, "model.scan_layers=false")
    tr = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    state = tr.init(tr.family.load_params(tr.family.weights_folder(cfg.init_from), tr.mesh))
    params0 = jax.tree.map(np.asarray, state["params"])
    key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), 0)
    batch = next(BatchIterator(cfg))
    new, metrics = tr.step(state, tr.put_batch(batch))
    return tr, params0, batch, key, metrics, new


@pytest.fixture(scope="module")
def many(ltx2):
    """The 8-device Trainer (one compiled step for every 8-device run below)."""
    cfg = _cfg(ltx2, *MESH8)
    return Trainer(cfg, make_mesh(cfg.mesh))


def test_preprocess_stores_what_the_ltx2_encoders_give(ltx2):
    """Per clip: the video VAE's normalised posterior mean (diffusers' VAE and
    ``_normalize_latents``), the audio VAE's posterior mean of the trainer's log-mel of the
    clip's sound over its frames' span, packed and normalised as the pipeline does (cut to
    the pipeline's 5 frames), and the caption's video and audio texts side by side; the clip
    without sound is named in one line and left out."""
    from ditax.io.audio import read_audio
    from ditax.io.video import read_video

    from gemma_reference import ltx2_reference_text
    from ltx2_audio_reference import reference_log_mel, rel_err

    pipe, ds, tmp = ltx2["pipe"], ltx2["ds"], ltx2["tmp"]
    meta = read_meta(ds)
    assert meta["num_samples"] == 3 and meta["latent_shape"] == [8, 2, 2, 3]
    assert meta["condition"] == {"audio_latents": [5, 8]} and meta["text_shape"] == [TEXT, 64]
    assert [s["file"] for s in meta["skipped"]] == ["clip2.mp4"]
    said = [ln for ln in ltx2["said"].splitlines() if "clip2.mp4" in ln]
    assert len(said) == 1 and "no sound track" in said[0], ltx2["said"]
    got = next(BatchIterator(_cfg(ltx2, "batch_size=3")))
    clips = [tmp / "clips" / f"clip{i}.mp4" for i in (0, 1, 3)]
    with torch.no_grad():
        frames = np.stack([read_video(c)[:FRAMES] for c in clips])          # [B, F, H, W, 3]
        x = torch.from_numpy(frames.transpose(0, 4, 1, 2, 3).astype(np.float32) / 127.5 - 1)
        z = pipe.vae.encode(x).latent_dist.mean
        z = pipe._normalize_latents(z, pipe.vae.latents_mean, pipe.vae.latents_std,
                                    pipe.vae.config.scaling_factor)
        n = int(FRAMES / 24 * 16000)
        waves = []
        for c in clips:
            w = read_audio(c, sample_rate=16000).samples[:, :n]
            waves.append(np.pad(w, ((0, 0), (0, n - w.shape[1]))))
        mel = reference_log_mel(np.stack(waves), 16000, 1024, 160, 16)
        a = pipe.audio_vae.encode(torch.from_numpy(mel.astype(np.float32))).latent_dist.mean
        a = pipe._normalize_audio_latents(pipe._pack_audio_latents(a[:, :, :5]),
                                          pipe.audio_vae.latents_mean,
                                          pipe.audio_vae.latents_std)
    video, audio, mask = ltx2_reference_text(pipe, [CAPTIONS[i] for i in (0, 1, 3)],
                                             ["", "", ""], TEXT)
    errs = {"video latents": rel_err(got["latents"], z.numpy()),
            "audio latents": rel_err(got["audio_latents"], a.numpy()),
            "text": rel_err(got["text"], np.concatenate([video[3:], audio[3:]], -1))}
    print("ltx2 preprocess rel err", {k: f"{v:.1e}" for k, v in errs.items()})
    assert max(errs.values()) < 1e-5, errs
    np.testing.assert_array_equal(got["text_mask"], mask[3:])


def test_loss_equals_diffusers_ltx2_loss(ltx2, first_step):
    """The step's loss, its video and audio terms and the gradient norm against the LTX-2
    trainer's loss with diffusers' model (the folder's transformer): both streams noised at
    one logit-normal sigma shifted by e^mu of the 12 video tokens, the model fed 1000 sigma,
    per-sample video + audio mean squared velocity errors."""
    from ditax.models.ltx2.training import pack_video, resolution_shift

    tr, _, batch, key, metrics, _ = first_step
    flow = tr.family.training_flow((8, 2, 2, 3))
    assert flow.shift == pytest.approx(resolution_shift(12))
    k_sigma, k_noise = jax.random.split(key)
    sigma = np.asarray(sample_sigmas(k_sigma, 2, flow))
    x0, a0 = batch["latents"], batch["audio_latents"]
    noise = np.asarray(jax.random.normal(k_noise, x0.shape, jnp.float32))
    a_noise = np.asarray(jax.random.normal(jax.random.fold_in(k_noise, 1), a0.shape))
    pack = lambda v: np.asarray(pack_video(jnp.asarray(v), 1, 1))  # noqa: E731
    want = flow_loss(ltx2["transformer"], pack(x0), a0, pack(noise), a_noise, sigma,
                     batch["text"], batch["text_mask"], 32, (2, 2, 3))
    got = [float(metrics[k]) for k in ("loss", "loss_latents", "loss_audio_latents",
                                       "grad_norm")]
    print("ltx2 loss (ours, diffusers)", list(zip(got, want)))
    for g, w in zip(got[:3], want[:3]):
        assert abs(g - w) <= 1e-5 * w, (got, want)
    assert abs(got[3] - want[3]) <= 1e-4 * want[3], (got, want)
    assert got[2] > 0.05 * got[0]          # the audio term is there, not negligible


def test_first_frame_conditioning_equals_the_i2v_loss(ltx2, first_step):
    """``train.first_frame_p=1``: every sample keeps its first latent frame clean, at timestep
    0, out of the video loss — the loss and its terms (the trainer's loss function, forward
    only) equal the same objective with diffusers' model fed as ``LTX2ImageToVideoPipeline``
    feeds it; the draw leaves the sigma and noise draws alone (the audio term's noise is
    p = 0's)."""
    from ditax.models.ltx2.training import pack_video

    _, params0, batch, key, m0, _ = first_step
    tr = Trainer(_cfg(ltx2, "model.scan_layers=false", "train.first_frame_p=1"),
                 make_mesh(ONE, jax.devices()[:1]))
    loss, parts = jax.jit(tr.loss_fn)(jax.device_put(params0, tr.params_sh),
                                      tr.put_batch(batch), key)
    metrics = {"loss": loss, "loss_latents": parts["latents"],
               "loss_audio_latents": parts["audio_latents"]}
    k_sigma, k_noise = jax.random.split(key)
    sigma = np.asarray(sample_sigmas(k_sigma, 2, tr.family.training_flow((8, 2, 2, 3))))
    x0, a0 = batch["latents"], batch["audio_latents"]
    noise = np.asarray(jax.random.normal(k_noise, x0.shape, jnp.float32))
    a_noise = np.asarray(jax.random.normal(jax.random.fold_in(k_noise, 1), a0.shape))
    pack = lambda v: np.asarray(pack_video(jnp.asarray(v), 1, 1))  # noqa: E731
    want = flow_loss(ltx2["transformer"], pack(x0), a0, pack(noise), a_noise, sigma,
                     batch["text"], batch["text_mask"], 32, (2, 2, 3), first_frame=True)
    got = [float(metrics[k]) for k in ("loss", "loss_latents", "loss_audio_latents")]
    print("ltx2 first-frame loss (ours, diffusers)", list(zip(got, want)))
    for g, w in zip(got, want[:3]):
        assert abs(g - w) <= 1e-5 * w, (got, want)
    assert abs(got[1] - float(m0["loss_latents"])) > 1e-3 * got[1]   # the condition matters


def test_one_step_on_fsdp2_context4_equals_one_device(first_step, many):
    """Same weights and batch: one step on fsdp 2 x context 4 (ring over the video tokens,
    full remat, scanned blocks) gives the loss, its terms, the gradient norm and the update
    of one device (blocks unrolled); another audio latent, another loss."""
    one, params0, batch, _, m1, s1 = first_step
    assert many.batch_sh["audio_latents"].spec == many.batch_sh["latents"].spec
    s8, m8 = many.step(many.init(params0), many.put_batch(batch))
    for k in ("loss", "loss_latents", "loss_audio_latents", "grad_norm"):
        assert abs(float(m8[k]) - float(m1[k])) < 1e-5 * float(m1[k]), k
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                         s8["params"], s1["params"])
    assert max(jax.tree.leaves(diffs)) < 3e-5
    other = dict(batch, audio_latents=batch["audio_latents"] * 0)
    _, m = many.step(many.init(params0), many.put_batch(other))
    assert abs(float(m["loss_audio_latents"]) - float(m1["loss_audio_latents"])) > 1e-4


def test_train_from_the_folder_resumes_bit_exact(ltx2, first_step, many):
    """``train`` from the folder's transformer on the preprocessed clips, on 8 devices: 1
    step and a resumed 1 equal 2 steps of the same Trainer straight, bit for bit; each row
    of metrics.jsonl carries the two terms of its loss."""
    import json

    from ditax.train.loop import train

    tmp, params0 = ltx2["tmp"], first_step[1]

    def cfg(steps):
        return _cfg(ltx2, *MESH8, f"steps={steps}", f"output_dir={tmp / 'run'}",
                    "checkpoint.every=1", "checkpoint.async_save=false", "data.shuffle=true")

    b1 = train(cfg(1), trainer=many, progress=False)
    b2 = train(cfg(2), trainer=many, progress=False)
    state, losses, data = many.init(params0), [], BatchIterator(cfg(2))
    for _ in range(2):
        state, m = many.step(state, many.put_batch(next(data)))
        losses.append(float(m["loss"]))
    assert b2.resumed_from == 1 and b1.losses + b2.losses == losses
    for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(b2.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    rows = [json.loads(ln) for ln in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(
        abs(r["loss_latents"] + r["loss_audio_latents"] - r["loss"]) < 1e-5 * r["loss"]
        for r in rows)


def test_lora_training_writes_adapters_that_load_back(ltx2, first_step):
    """``lora.rank=2`` on one device: one step trains the adapters (the base is frozen), the
    run's writer saves them in diffusers and original LTX-2 keys, and each file loads into
    the folder's transformer as base + the trained ``up @ down``
    (``ditax.load_transformer(loras=)``)."""
    from flax import nnx

    import ditax

    batch = first_step[2]
    cfg = _cfg(ltx2, "lora.rank=2", "lora.targets=self_attn")
    tr = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    state = tr.init(tr.family.load_params(tr.family.weights_folder(cfg.init_from), tr.mesh))
    state, m = tr.step(state, tr.put_batch(batch))
    assert np.isfinite(float(m["loss_audio_latents"]))
    files = tr.adapters.save(ltx2["tmp"] / "lora", state["params"])
    assert len(files) == 2, files
    trained = jax.tree.map(np.asarray, state["params"])
    q = trained["transformer_blocks"]["attn1"]["to_q"]
    delta = np.einsum("lro,lri->lio", q["lora_up"], q["lora_down"])   # [L, in, out], scale 1
    assert np.abs(delta).max() > 0

    def kernel(tr):
        return np.asarray(nnx.state(tr.module)["transformer_blocks"]["attn1"]["to_q"][
            "kernel"][...])

    base = kernel(ditax.load_transformer(ltx2["folder"]))
    for f in files:
        got = kernel(ditax.load_transformer(ltx2["folder"], loras=[(str(f), 1.0)]))
        np.testing.assert_allclose(got, base + delta.reshape(base.shape), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("argv,words", [
    (["train", "ltx-2", "flow.guidance=3.5"], "embeds no guidance"),
    (["train", "ltx-2", "flow.dynamic_shift=true", "flow.shift=3"], "flow.dynamic_shift=true"),
    (["train", "ltx-2", "model.out_channels=64"], "flow loss compares"),
    (["train", "ltx-2", "data.num_frames=120", "batch_size=8"], "8·k + 1 frames"),
    (["train", "ltx-2", "train.first_frame_p=1.5"], "train.first_frame_p=1.5 is a probability"),
    (["train", "tiny", "train.first_frame_p=0.1"], "does not train first-frame"),
])
def test_bad_ltx2_training_input_is_one_line(argv, words, capsys, tmp_path):
    from ditax.cli import main

    rc = main(argv + [f"output_dir={tmp_path / 'run'}", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err


def _published_lora(folder, rng):
    """A rank-2 LoRA in diffusers / PEFT keys on block, stream-embedding and renamed modules
    of the folder's transformer (each ``(A [r, in], B [out, r])``), and the same tensors under
    the original LTX-2 names (``diffusion_model.``, ``patchify_proj``, ``adaln_single`` ...)."""
    import json

    cfg = json.loads((folder / "transformer" / "config.json").read_text())
    d, da, c = (cfg["num_attention_heads"] * cfg["attention_head_dim"],
                cfg["audio_num_attention_heads"] * cfg["audio_attention_head_dim"],
                cfg["caption_channels"])
    shapes = {"transformer_blocks.0.attn1.to_q": (d, d),
              "transformer_blocks.1.audio_attn2.to_v": (da, da),
              "transformer_blocks.1.video_to_audio_attn.to_out.0": (da, da),
              "transformer_blocks.0.audio_ff.net.0.proj": (da, 4 * da),
              "proj_in": (cfg["in_channels"], d),
              "audio_caption_projection.linear_1": (c, da),
              "time_embed.emb.timestep_embedder.linear_1": (256, d),
              "av_cross_attn_audio_v2a_gate.linear": (da, da)}
    peft, original = {}, {}
    renames = {"proj_in": "patchify_proj", "time_embed.": "adaln_single.",
               "av_cross_attn_audio_v2a_gate": "av_ca_v2a_gate_adaln_single"}
    for name, (din, dout) in shapes.items():
        a = rng.standard_normal((2, din)).astype(np.float32) * 0.1
        b = rng.standard_normal((dout, 2)).astype(np.float32) * 0.1
        orig = name
        for new, old in renames.items():
            orig = orig.replace(new, old) if orig.startswith(new) else orig
        for part, x in (("lora_A", a), ("lora_B", b)):
            peft[f"transformer.{name}.{part}.weight"] = x
            original[f"diffusion_model.{orig}.{part}.weight"] = x
    return peft, original


def test_published_ltx2_loras_load_as_merged_weights(ltx2):
    """A LoRA in the diffusers / PEFT keys and the same one in the original LTX-2 keys (which
    diffusers' own converter maps back to the PEFT keys) load into
    ``ditax.load_transformer`` as base + 0.7 · B @ A on every layer they name, and the
    pipeline loader takes ``loras=`` the same way."""
    from flax import nnx
    from safetensors.numpy import save_file

    import ditax
    from diffusers.loaders.lora_conversion_utils import (
        _convert_non_diffusers_ltx2_lora_to_diffusers as convert)

    folder, tmp = ltx2["folder"], ltx2["tmp"]
    peft, original = _published_lora(folder, np.random.default_rng(3))
    assert sorted(convert({k: torch.from_numpy(v) for k, v in original.items()})) == sorted(peft)
    save_file(peft, str(tmp / "peft.safetensors"))
    save_file(original, str(tmp / "original.safetensors"))

    def flat(tr):
        return {".".join(str(getattr(k, "key", k)) for k in p): np.asarray(v) for p, v in
                jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(tr.module)))[0]}

    base = flat(ditax.load_transformer(folder))
    want = dict(base)
    for key, a in peft.items():
        if ".lora_A." not in key:
            continue
        name = key[len("transformer."):key.index(".lora_A.")]
        delta = 0.7 * (peft[key.replace("lora_A", "lora_B")] @ a).T       # [in, out]
        path = name.replace("net.0.proj", "proj_in").replace("to_out.0", "to_out")
        if path.startswith("transformer_blocks."):
            i, rest = path.split(".", 2)[1:]
            k = f"transformer_blocks.{rest}.kernel"
            want[k] = want[k].copy()
            want[k][int(i)] += delta.reshape(want[k][int(i)].shape)
        else:
            k = f"{path}.kernel"
            want[k] = want[k] + delta.reshape(want[k].shape)
    moved = [k for k in want if not np.array_equal(want[k], base[k])]
    assert len(moved) == 8, moved
    for f in ("peft", "original"):
        got = flat(ditax.load_transformer(folder, loras=[(str(tmp / f"{f}.safetensors"), 0.7)]))
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=(f, k))
    pipe = ditax.load_pipeline(folder, loras=[(str(tmp / "original.safetensors"), 0.7)])
    got = flat(pipe.transformer)
    for k in moved:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    # the text connectors' keys (original text_embedding_projection.) are set aside for the
    # pipeline's connectors (tests/lora/test_ltx2_connector_lora.py), not read as rows here
    from ditax.lora.table import read_lora
    from ditax.models.ltx2.lora_names import LORA_NAMES

    key = "text_embedding_projection.aggregate_embed.lora_A.weight"
    save_file({**original, key: np.zeros((2, 8), np.float32)}, str(tmp / "connectors.safetensors"))
    lora = read_lora(tmp / "connectors.safetensors", names=LORA_NAMES)
    assert list(lora.components) == ["connectors"] and list(lora.components["connectors"]) == [key]
    assert len(lora.rows) == len(read_lora(tmp / "original.safetensors", names=LORA_NAMES).rows)
