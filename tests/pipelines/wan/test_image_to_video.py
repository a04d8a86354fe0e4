"""Image-to-video pipelines vs diffusers on tiny random components saved in diffusers' formats
(same initial latents, whole videos within 1e-3): Wan 2.1 I2V (CLIP + channels), first-last-frame,
Wan 2.2 I2V two experts, Wan 2.2 TI2V text-only and with an image (per-token timesteps), the
2.1 I2V on an 8-device mesh; one compiled step per request shape; bad requests and folders.

diffusers slices the image tokens off the cross-attention context as ``len - 512``, so both
sides keep ``max_sequence_length`` at 512.
"""

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.config import AttentionConfig  # noqa: E402
from ditax.errors import RequestError  # noqa: E402
from ditax.parallel import make_mesh  # noqa: E402
from ditax.pipelines.wan.folder import PipelineLoadError  # noqa: E402
from compiles import compiles  # noqa: E402
from i2v_reference import (PROMPT, SIZE21, SIZE22, image, make_tiny_i2v,  # noqa: E402
                           run_reference)

STEP = "_denoise_step"
TOL = 1e-3


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each kind built once: ``kind -> (diffusers pipelines, folder, ditax pipeline)``."""
    cache = {}

    def get(kind):
        if kind not in cache:
            refs, folder = make_tiny_i2v(tmp_path_factory.mktemp(kind), kind)
            cache[kind] = refs, folder, ditax.load_pipeline(folder)
        return cache[kind]
    return get


@pytest.fixture(scope="module")
def t2v_folder(tmp_path_factory):
    from pipeline_reference import make_tiny_pipeline

    return make_tiny_pipeline(tmp_path_factory.mktemp("t2v"), layers=1)[1]


def _latents(pipe, size, seed):
    shape = pipe.latent_shape(size["height"], size["width"], size["num_frames"])
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _compare(name, got, want):
    err = float(np.abs(got - want).max())
    print(f"{name}: max abs diff vs diffusers {err:.2e}")
    assert got.shape == want.shape and got.dtype == np.float32
    assert err < TOL, err
    assert got.std() > 1e-3  # a real video, not a constant


def test_wan21_i2v_matches_diffusers(built):
    refs, _, pipe = built("i2v")
    assert type(pipe).__name__ == "WanImageToVideo" and pipe.image_encoder is not None
    first = image(1, 40, 56)  # another size than the video: both resizes (Lanczos, CLIP) run
    lat = _latents(pipe, SIZE21, 1)
    kw = dict(PROMPT, **SIZE21, num_inference_steps=3, guidance_scale=5.0)
    with compiles() as log:
        got = pipe(image=first, latents=lat, progress=False, **kw)
    assert log.count(STEP) <= 1, log.names
    _compare("wan2.1 i2v", got, run_reference(refs["image"], lat, image=first, **kw))
    assert pipe.timings.image > 0
    # the image conditions the video: another image, another video; same shapes, no compile
    with compiles() as again:
        other = pipe(image=image(2, 40, 56), latents=lat, progress=False, **kw)
    assert again.count(STEP) == 0, again.names
    assert np.abs(other - got).max() > 1e-2


def test_flf2v_matches_diffusers(built):
    refs, _, pipe = built("flf2v")
    assert pipe.transformer.config.pos_embed_seq_len is not None
    first, last = image(3, 32, 48), image(4, 48, 32)
    lat = _latents(pipe, SIZE21, 2)
    kw = dict(PROMPT, **SIZE21, num_inference_steps=3, guidance_scale=4.0)
    got = pipe(image=first, last_image=last, latents=lat, progress=False, **kw)
    _compare("flf2v", got, run_reference(refs["image"], lat, image=first, last_image=last, **kw))
    only_first = pipe(image=first, last_image=first, latents=lat, progress=False, **kw)
    assert np.abs(only_first - got).max() > 1e-2  # the last frame matters


def test_wan22_i2v_two_experts_match_diffusers(built):
    refs, _, pipe = built("i2v22")
    assert pipe.image_encoder is None and pipe.transformer_2 is not None
    t = np.asarray(pipe.scheduler.set_timesteps(2, (1,)).timesteps)
    assert (t >= 800).any() and (t < 800).any()  # both experts run (one step each)
    first = image(5, 32, 48)
    lat = _latents(pipe, SIZE21, 3)
    kw = dict(PROMPT, **SIZE21, num_inference_steps=2, guidance_scale=4.0, guidance_scale_2=2.0)
    got = pipe(image=first, latents=lat, progress=False, **kw)
    _compare("wan2.2 i2v two experts", got, run_reference(refs["image"], lat, image=first, **kw))
    # Wan 2.2 A14B takes a last frame without an image encoder (mask + condition only); the
    # same step count (and so the same compiled step) as above and the CLI test below
    last = image(6, 32, 48)
    got = pipe(image=first, last_image=last, latents=lat, progress=False, **kw)
    _compare("wan2.2 i2v first-last", got,
             run_reference(refs["image"], lat, image=first, last_image=last, **kw))


def test_ti2v_text_only_matches_diffusers(built):
    refs, _, pipe = built("ti2v")
    assert pipe.kind == "ti2v" and pipe.vae.z_dim == 12
    lat = _latents(pipe, SIZE22, 4)
    kw = dict(PROMPT, **SIZE22, num_inference_steps=3, guidance_scale=5.0)
    got = pipe(latents=lat, progress=False, **kw)
    assert got.shape == (9, 32, 64, 3)
    _compare("ti2v text", got, run_reference(refs["text"], lat, **kw))


def test_ti2v_image_matches_diffusers(built):
    """Float image of another size (nearest resize as diffusers); the first latent frame's tokens
    at t=0 and the image's latents blended in before each step and at the end."""
    refs, _, pipe = built("ti2v")
    first = image(7, 24, 80, kind="float")
    lat = _latents(pipe, SIZE22, 5)
    kw = dict(PROMPT, **SIZE22, num_inference_steps=3, guidance_scale=5.0)
    with compiles() as log:
        got = pipe(image=first, latents=lat, progress=False, **kw)
    assert log.count(STEP) <= 1, log.names
    # diffusers takes a float image as a torch tensor [3, H, W] (the same nearest resize)
    as_tensor = torch.from_numpy(np.ascontiguousarray(first.transpose(2, 0, 1)))
    _compare("ti2v image", got, run_reference(refs["image"], lat, image=as_tensor, **kw))
    text_only = pipe(latents=lat, progress=False, **kw)
    assert np.abs(text_only[0] - got[0]).max() > 1e-2


def test_wan21_i2v_on_8_devices(built):
    """fsdp=2 (cond / uncond) x context=4 (tokens, padded: 2 x 2 x 3 = 12 tokens fit; the image
    and text keys replicated), Ulysses attention: the image encoded and the video denoised on
    the mesh give the single-device latents, whose video is diffusers'. The latents, not the
    decoded frames: decoding on this mesh is the text-to-video pipeline's, checked by
    test_text_to_video.py's mesh case, and would add the mesh decode's compile here."""
    refs, folder, single = built("i2v")
    mesh = make_mesh({"fsdp": 2, "context": 4})
    pipe = ditax.load_pipeline(folder, mesh=mesh, attention=AttentionConfig(backend="ulysses"))
    k = pipe.transformer.module.blocks.attn2.add_k_proj.kernel[...]
    assert k.sharding.shard_shape(k.shape) != k.shape  # really sharded
    first = image(8, 32, 48)
    lat = _latents(single, SIZE21, 6)
    # 3 steps, as test_wan21_i2v_matches_diffusers: the single-device step is compiled once
    kw = dict(PROMPT, **SIZE21, num_inference_steps=3, guidance_scale=5.0, latents=lat,
              progress=False)
    got = pipe(image=first, output="latent", **kw)
    np.testing.assert_allclose(got, single(image=first, output="latent", **kw), atol=1e-5)
    _compare("wan2.1 i2v single device (the mesh's latents)", single(image=first, **kw),
             run_reference(refs["image"], lat, image=first, **{k: v for k, v in kw.items()
                                                              if k not in ("latents",
                                                                           "progress")}))


@pytest.mark.parametrize("kind,change,match", [
    ("i2v", dict(image=None), r"image-to-video folder .*pass the first frame: image="),
    ("i2v", dict(last_image="LAST"), r"needs a first-last-frame model"),
    ("ti2v", dict(last_image="LAST"), r"TI2V .*first frame only"),
    ("ti2v", dict(image=None, last_image="LAST"), r"last_image= needs image="),
    ("i2v22", dict(image=np.zeros((8, 8, 3), np.uint8)), r"dtype uint8; pass floats in \[0, 1\]"),
    ("i2v22", dict(image=np.full((8, 8, 3), 2.0)), r"values span \[2, 2\]"),
    ("i2v22", dict(image=np.zeros((8, 8))), r"must be \[H, W, 3\]"),
    ("i2v22", dict(image="first.png"), r"is a path; pass the image itself"),
    ("i2v22", dict(num_frames=1, last_image="LAST"), r"more than one frame; num_frames=1"),
    ("ti2v", dict(height=48), r"height=48 must be a positive multiple of 32"),
    ("i2v22", dict(mask=np.ones((5, 32, 32))),
     r"mask= is a VACE control input; this WanImageToVideo .*load a VACE folder"),
])
def test_bad_requests(built, kind, change, match):
    _, _, pipe = built(kind)
    size = SIZE22 if kind == "ti2v" else SIZE21
    kw = dict(PROMPT, **size, num_inference_steps=1, guidance_scale=1.0, progress=False,
              image=image(9, 32, 32))
    kw.update(change)
    if isinstance(kw.get("last_image"), str) and kw["last_image"] == "LAST":
        kw["last_image"] = image(10, 32, 32)
    with pytest.raises(RequestError, match=match):
        pipe(**kw)


def test_text_to_video_folder_refuses_an_image(t2v_folder):
    pipe = ditax.load_pipeline(t2v_folder)
    assert type(pipe).__name__ == "WanTextToVideo"
    with pytest.raises(RequestError, match="text-to-video .* takes no image"):
        pipe("a cat", image=image(0, 32, 32), height=32, width=32, num_frames=5,
             num_inference_steps=1, progress=False)


def _edit(path, **upd):
    d = json.loads(path.read_text())
    d.update(upd)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("breakage,match", [
    ("no_processor", r"has 'image_encoder' but no 'image_processor'"),
    ("t2v_class", r"is a WanPipeline with 'image_encoder'"),
    ("no_encoder_for_image_dim", r"image_dim=32 but the folder has no image_encoder"),
    ("other_class", r"is a StableDiffusionPipeline; ditax loads WanPipeline and "
                    r"WanImageToVideoPipeline and .* folders"),
])
def test_broken_folders(built, tmp_path, breakage, match):
    _, folder, _ = built("i2v")
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    index = bad / "model_index.json"
    if breakage == "no_processor":
        _edit(index, image_processor=[None, None])
    elif breakage == "t2v_class":
        _edit(index, _class_name="WanPipeline")
    elif breakage == "no_encoder_for_image_dim":
        _edit(index, image_encoder=[None, None], image_processor=[None, None])
    elif breakage == "other_class":
        _edit(index, _class_name="StableDiffusionPipeline")
    with pytest.raises(PipelineLoadError, match=match):
        ditax.load_pipeline(bad)


def test_channel_layout_is_checked(built):
    """An I2V transformer reads noise + mask (temporal factor) + condition latents."""
    import dataclasses

    from ditax.pipelines.wan.components import check_image_fit

    _, _, pipe = built("i2v22")
    tc = pipe.transformer.config
    check_image_fit(pipe.vae, tc, "i2v", None)  # 4 + 4 + 4 = 12 in, 4 out
    with pytest.raises(PipelineLoadError, match=r"in/out channels 16/4 do not fit vae z_dim=4: "
                                                r"expected 12"):
        check_image_fit(pipe.vae, dataclasses.replace(tc, in_channels=16), "i2v", None)


def test_ti2v_folder_saved_as_image_to_video_class_loads_the_same(built, tmp_path):
    refs, folder, pipe = built("ti2v")
    other = tmp_path / "ti2v_i2v_class"
    refs["image"].save_pretrained(other)
    assert json.loads((other / "model_index.json").read_text())["expand_timesteps"] is True
    again = ditax.load_pipeline(other)
    assert again.kind == "ti2v"
    lat = _latents(pipe, SIZE22, 11)
    # the request shape of test_ti2v_image_matches_diffusers: its compiled step serves both
    kw = dict(PROMPT, **SIZE22, num_inference_steps=3, guidance_scale=5.0, latents=lat,
              progress=False, image=image(12, 32, 64, kind="float"))
    np.testing.assert_array_equal(again(**kw), pipe(**kw))


# ----------------------------------------------------------------------------------------------
# ditax generate --image / --last-image


def test_generate_with_image_writes_the_pipelines_video(built, tmp_path, capsys):
    from ditax.cli import main
    from ditax.io.video import read_video, to_uint8

    _, folder, pipe = built("i2v22")
    first, last = tmp_path / "first.png", tmp_path / "last.png"
    image(13, 32, 48).save(first)
    image(14, 32, 48).save(last)
    out = tmp_path / "o.mp4"
    rc = main(["generate", "--model", str(folder), "--prompt", "a cat walks on the grass",
               "--image", str(first), "--last-image", str(last), "--height", "32", "--width",
               "48", "--frames", "5", "--steps", "2", "--guidance", "3", "--seed", "4",
               "--no-progress", "--output", str(out)])
    assert rc == 0
    assert "image " in capsys.readouterr().out   # the timing line has the image phase
    import PIL.Image

    ref = to_uint8(pipe("a cat walks on the grass", image=PIL.Image.open(first),
                        last_image=PIL.Image.open(last), height=32, width=48, num_frames=5,
                        num_inference_steps=2, guidance_scale=3.0, seed=4, progress=False))
    assert np.abs(read_video(out).astype(np.float32) - ref).mean() < 6.0


@pytest.mark.parametrize("kind,flags,match", [
    ("i2v22", ["--image", "MISSING"], r"--image '.*missing.png' is not a file"),
    ("i2v22", ["--image", "BROKEN"], r"--image '.*broken.png' is not a readable image"),
    ("i2v22", [], r"is an image-to-video folder .*pass the first frame with --image"),
    ("i2v22", ["--last-image", "GOOD"], r"--last-image needs --image"),
    ("ti2v", ["--image", "GOOD", "--last-image", "GOOD"], r"--last-image is not supported by"),
    ("t2v", ["--image", "GOOD"], r"--image given but .* is a text-to-video folder"),
])
def test_generate_image_errors_exit_2_in_one_line(built, t2v_folder, tmp_path, capsys, kind,
                                                  flags, match):
    import re

    from ditax.cli import main

    folder = t2v_folder if kind == "t2v" else built(kind)[1]
    image(15, 32, 32).save(tmp_path / "good.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    names = {"MISSING": "missing.png", "BROKEN": "broken.png", "GOOD": "good.png"}
    capsys.readouterr()   # building the folder printed diffusers' progress bars
    flags = [str(tmp_path / names[f]) if f in names else f for f in flags]
    rc = main(["generate", "--model", str(folder), "--prompt", "a cat", *flags, "--height",
               "32", "--width", "64", "--frames", "5", "--output", str(tmp_path / "o.mp4")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and re.search(match, err), err
