"""Wan VACE pipeline vs diffusers' ``WanVACEPipeline`` on a tiny random Wan 2.2-style folder
(two VACE experts, boundary_ratio) saved in diffusers' format (same initial latents, whole
videos within 1e-3): a control video with a mask (inpainting) and a reference image of another
size at conditioning_scale 0.5, then reference-to-video alone (same shapes: no new step
compile), and a fresh pipeline reading every program of the control request from the
persistent compile cache; bad control inputs refused in one line before anything is
encoded, and by the CLI's preflight before any weights."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.errors import RequestError  # noqa: E402
from compiles import compiles  # noqa: E402
from i2v_reference import PROMPT, image  # noqa: E402
from vace_reference import make_tiny_vace  # noqa: E402

SIZE = dict(height=32, width=48, num_frames=5)
TOL = 1e-3


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    ref, folder = make_tiny_vace(tmp_path_factory.mktemp("vace"))
    return ref, folder, ditax.load_pipeline(folder)


def _frames(seed, n=SIZE["num_frames"]):
    return [image(seed + i, SIZE["height"], SIZE["width"]) for i in range(n)]


def _mask(n=SIZE["num_frames"]):
    """White (generate) in a box of the middle frames, black (keep) elsewhere (PIL RGB)."""
    import PIL.Image

    out = []
    for i in range(n):
        m = np.zeros((SIZE["height"], SIZE["width"], 3), np.uint8)
        if 0 < i < n - 1:
            m[8:24, 16:40] = 255
        out.append(PIL.Image.fromarray(m))
    return out


def _reference(pipe, latents, **kw):
    with torch.no_grad():
        out = pipe(latents=torch.from_numpy(latents), output_type="np", **kw)
    return np.asarray(out.frames[0], np.float32)


def _compare(name, got, want):
    err = float(np.abs(got - want).max())
    print(f"{name}: max abs diff vs diffusers {err:.2e}")
    assert got.shape == want.shape and got.dtype == np.float32
    assert err < TOL, err
    assert got.std() > 1e-3


def test_vace_matches_diffusers_and_a_fresh_pipeline_takes_its_programs_from_the_cache(
        built, tmp_path):
    """The control request against diffusers, written to a persistent compile cache; then
    reference-to-video alone (same shapes, same compiled step); then a fresh pipeline from the
    same folder (jax's in-memory caches cleared) makes the control request again: the control
    inputs are arguments of the compiled programs, not constants, so it reads every program it
    needs from the cache the first one wrote, writes nothing, and makes the same video."""
    import jax

    ref, folder, loaded = built
    refimg = image(9, 40, 32)       # another aspect: fitted on a white canvas, bilinear
    shape = loaded.latent_shape(SIZE["height"], SIZE["width"], SIZE["num_frames"] + 4)
    lat = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    kw = dict(PROMPT, **SIZE, num_inference_steps=3, guidance_scale=5.0, guidance_scale_2=3.0)
    control = dict(video=_frames(1), mask=_mask(), reference_images=[refimg],
                   conditioning_scale=0.5)
    hits, writes = [], []

    def event(name, **kw):
        if name == "/jax/compilation_cache/cache_hits":
            hits.append(name)
        elif name == "/jax/compilation_cache/cache_misses":
            writes.append(name)

    jax.monitoring.register_event_listener(event)
    cc = str(tmp_path / "cc")
    try:
        jax.clear_caches()              # both pipelines loaded after it, as a fresh process
        pipe = ditax.load_pipeline(folder)
        assert type(pipe).__name__ == "WanVace" and pipe.transformer_2 is not None
        pipe.compile_cache = cc
        del hits[:], writes[:]
        with compiles() as log:
            got = pipe(latents=lat, progress=False, **control, **kw)
        wrote = len(writes)
        assert log.count("_denoise_step") <= 1, log.names
        _compare("vace 2 experts, inpaint + reference, scale 0.5", got,
                 _reference(ref, lat, **control, **kw))
        # reference-to-video alone: the same shapes, so the same compiled step
        with compiles() as again:
            r2v = pipe(latents=lat, reference_images=refimg, progress=False, **kw)
        assert again.count("_denoise_step") == 0, again.names
        _compare("vace reference-to-video", r2v,
                 _reference(ref, lat, reference_images=refimg, **kw))
        assert np.abs(r2v - got).max() > 1e-2
        jax.clear_caches()
        fresh = ditax.load_pipeline(folder)
        fresh.compile_cache = cc
        del hits[:], writes[:]
        second = fresh(latents=lat, progress=False, **control, **kw)
        hit, rewrote = len(hits), len(writes)
    finally:
        jax.monitoring.unregister_event_listener(event)
    assert wrote > 0 and rewrote == 0 and hit >= wrote, (wrote, hit, rewrote)
    np.testing.assert_array_equal(second, got)


@pytest.mark.parametrize("kw,match", [
    (dict(video="FRAMES3"), r"video has 3 frames but the request makes num_frames=5"),
    (dict(video="SMALL"), r"video frame 0 is 16x48 \(HxW\) but the request is 32x48"),
    (dict(video="FRAMES5", mask="GREY"), r"mask frame 0 is not binary \(a value 0.502\)"),
    (dict(video="FRAMES5", mask="FRAMES3"),
     r"mask has 3 frames but the request makes num_frames=5"),
    (dict(conditioning_scale=[1.0, 2.0, 3.0]), r"conditioning_scale=\[1.0, 2.0, 3.0\] must be"),
    (dict(image="IMG"), r"image= / last_image= are for image-to-video folders"),
], ids=["frames", "size", "grey-mask", "mask-frames", "scales", "image"])
def test_bad_control_inputs(built, kw, match):
    pipe = built[2]
    value = {"FRAMES3": _frames(0, 3), "FRAMES5": _frames(0),
             "SMALL": [f.crop((0, 0, 48, 16)) for f in _frames(0)],
             "GREY": [np.full((32, 48), 0.502, np.float32)] * 5, "IMG": image(0, 32, 48)}
    kw = {k: value.get(v, v) if isinstance(v, str) else v for k, v in kw.items()}
    with pytest.raises(RequestError, match=match):
        pipe(PROMPT["prompt"], **SIZE, num_inference_steps=1, progress=False, **kw)


def test_cli_preflight_refuses_before_weights(built):
    """What ``ditax generate`` checks before any weights load (the family's preflight):
    VACE inputs on another folder, and a control video / mask that does not fit."""
    from ditax.pipelines.wan.family import check_images_fit

    folder = built[1]
    call = dict(prompt="x", **SIZE, num_inference_steps=1)
    with pytest.raises(RequestError, match=r"VACE inputs \(reference_images given\), but t2v "
                                           r"is a WanPipeline folder"):
        check_images_fit("t2v", {"_class_name": "WanPipeline"},
                         dict(call, reference_images=[image(0, 32, 48)]))
    index = {"_class_name": "WanVACEPipeline"}
    frames = np.stack([np.asarray(f, np.float32) / 255 for f in _frames(0)])
    check_images_fit(folder, index, dict(call, video=frames, mask=np.ones((5, 32, 48, 3))))
    with pytest.raises(RequestError, match=r"video has 4 frames but the request makes "
                                           r"num_frames=5"):
        check_images_fit(folder, index, dict(call, video=frames[:4]))
    with pytest.raises(RequestError, match=r"mask= needs video="):
        check_images_fit(folder, index, dict(call, mask=np.ones((5, 32, 48))))
