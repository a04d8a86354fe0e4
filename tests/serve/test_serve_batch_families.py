"""``ditax serve`` batches any family's jobs of one shape through the generic loop: an image
model (a tiny random FLUX.1 folder, dev-style, true CFG on when the API takes it) and a Wan 2.2
TI2V folder with images (other images, one shape; the image replaces the first latent frame).
While a first job of another shape runs, two jobs of one shape queue and run as one batch
(``batch_size`` 2); each output equals its request run alone (``batch_size`` 1) within float
rounding, and the two differ."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from serve_fixtures import Server, assert_same_video, mp4_frames, shared_cache

pytest.importorskip("torch")
pytest.importorskip("diffusers")


def _batched_pair(srv, blocker: dict, bodies: list[dict]) -> tuple[list[dict], list[dict]]:
    """Submit ``blocker`` then ``bodies`` (one shape) while it runs: the finished jobs of
    ``bodies`` (run as one batch) and of the same bodies submitted again one by one."""
    first = srv.call("POST", "/v1/videos", blocker)[2]
    ids = [srv.call("POST", "/v1/videos", b)[2]["id"] for b in bodies]
    assert srv.wait(first["id"])["status"] == "completed"
    batched = [srv.wait(i) for i in ids]
    alone = [srv.wait(srv.call("POST", "/v1/videos", b)[2]["id"]) for b in bodies]
    assert [j["status"] for j in batched + alone] == ["completed"] * 4, batched + alone
    assert [j["batch_size"] for j in batched] == [2, 2], batched
    assert [j["batch_size"] for j in alone] == [1, 1], alone
    return batched, alone


def test_flux_jobs_batch_with_true_cfg(tmp_path_factory):
    import PIL.Image

    from flux_reference import make_tiny_flux_pipeline

    tmp = tmp_path_factory.mktemp("serve_flux_batch")
    _, folder = make_tiny_flux_pipeline(tmp, guidance_embeds=True)
    srv = Server(tmp / "srv", "sample.max_sequence_length=16", "--max-batch", "2", model=folder,
                 cache=shared_cache(tmp_path_factory)).start()
    body = {"size": "32x32", "num_inference_steps": 2, "true_cfg_scale": 2.0}
    try:
        status, _, data = srv.call("POST", "/v1/videos", {"prompt": "x", **body,
                                                          "negative_prompt": "blurry"})
        if status == 400 and data["error"].get("param") == "true_cfg_scale":
            body.pop("true_cfg_scale")      # a server without the true-CFG field: plain rows
            neg = {}
        else:
            assert status == 200, data
            srv.wait(data["id"])
            neg = {"negative_prompt": "blurry"}
        batched, alone = _batched_pair(
            srv, {"prompt": "a cat", **neg, **body, "num_inference_steps": 3},
            [{"prompt": "a cat", **neg, **body, "seed": 1},
             {"prompt": "a dog on a beach", **neg, **body, "seed": 2}])

        def png(job):
            return np.asarray(PIL.Image.open(io.BytesIO(srv.call("GET", job["url"])[2])),
                              np.int32)
        for b, a in zip(batched, alone):
            assert np.abs(png(b) - png(a)).max() <= 1
        assert np.abs(png(batched[0]) - png(batched[1])).max() > 10
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-2000:]


def test_image_to_video_jobs_batch(tmp_path_factory, tmp_path):
    from i2v_reference import SIZE22, image, make_tiny_i2v

    tmp = tmp_path_factory.mktemp("serve_i2v_batch")
    _, folder = make_tiny_i2v(tmp, "ti2v")   # image optional: the server's startup check
    # sends a prompt-only request, which an image-required (I2V) folder refuses
    srv = Server(tmp / "srv", "--max-batch", "2", model=folder,
                 cache=shared_cache(tmp_path_factory)).start()

    def b64(seed):
        buf = io.BytesIO()
        image(seed, SIZE22["height"], SIZE22["width"]).save(buf, format="PNG")
        return base64.b64encode(buf.getvalue()).decode()

    body = {"size": f"{SIZE22['width']}x{SIZE22['height']}", "num_frames": SIZE22["num_frames"],
            "num_inference_steps": 2, "guidance_scale": 5.0}
    try:
        batched, alone = _batched_pair(
            srv, {"prompt": "a cat", "image": b64(0), **body, "num_inference_steps": 3},
            [{"prompt": "a cat", "image": b64(1), **body, "seed": 1},
             {"prompt": "a dog runs", "image": b64(2), **body, "seed": 2}])

        def video(job):
            return mp4_frames(srv.call("GET", job["url"])[2], tmp_path).astype(np.int32)
        for b, a in zip(batched, alone):
            assert_same_video(video(b), video(a))
        assert np.abs(video(batched[0]) - video(batched[1])).max() > 10
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-2000:]
