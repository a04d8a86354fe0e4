"""``ditax serve`` on an image model (a tiny random FLUX.1 ``FluxPipeline`` folder, schnell-style,
32x32, 2 steps): the same ``/v1/videos`` job routes, the content a PNG of the asked size equal to
the pipeline's image for the seed (what ``ditax generate`` writes); a video-only field gets a
400 with generate's words; a second same-shape job compiles nothing."""

from __future__ import annotations

import io

import numpy as np
import pytest
from serve_fixtures import Server, shared_cache

pytest.importorskip("torch")
pytest.importorskip("diffusers")

from flux_reference import make_tiny_flux_pipeline  # noqa: E402

SEQ = "sample.max_sequence_length=16"
BODY = {"prompt": "a cat", "size": "32x32", "num_inference_steps": 2}


def test_image_model_jobs_are_pngs_equal_to_the_pipeline(tmp_path_factory, capsys):
    import PIL.Image

    import ditax
    from ditax.cli import main

    tmp = tmp_path_factory.mktemp("serve_image")
    _, folder = make_tiny_flux_pipeline(tmp, guidance_embeds=False)
    srv = Server(tmp / "srv", SEQ, "--max-batch", "2", model=folder,
                 cache=shared_cache(tmp_path_factory)).start()
    try:
        job = srv.call("POST", "/v1/videos", {**BODY, "seed": 3})[2]
        assert job["status"] == "queued" and job["object"] == "image", job
        # a video family's field: refused naming the family whose it is, in the API's words
        # (the JSON field) on the server and the flag's on the CLI
        status, _, data = srv.call("POST", "/v1/videos", {**BODY, "num_frames": 5})
        rc = main(["generate", "--model", str(folder), "--prompt", "a cat", "--frames", "5",
                   "--output", str(tmp / "x.png"), "--no-progress", SEQ])
        words = capsys.readouterr().err.strip().splitlines()[-1].removeprefix(
            "ditax generate: error: ")
        assert rc == 2 and status == 400, data
        api = data["error"]["message"]
        assert data["error"]["param"] == "num_frames" and "--" not in api, data
        assert api.startswith("num_frames is not taken by flux models"), api
        assert words.startswith("--frames is not taken by flux models"), words
        assert api.split("); ", 1)[1] == words.split("); ", 1)[1] == "it is for ltx2, wan models " \
            "— drop it"
        # the page shows the fields /health lists: an image family's, no frames, no image
        fields = srv.call("GET", "/health")[2]["fields"]
        assert "true_cfg_scale" in fields and "guidance_scale" in fields, fields
        assert not {"num_frames", "image", "last_image", "cache"} & set(fields), fields
        done = srv.wait(job["id"])
        assert done["status"] == "completed" and done["url"].endswith("/content"), done
        status, head, png = srv.call("GET", done["url"])
        assert status == 200 and head["content-type"] == "image/png"
        image = np.asarray(PIL.Image.open(io.BytesIO(png)))
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8
        # ditax generate with the same request and seed (the server's compile cache): the
        # same PNG, byte for byte
        out = tmp / "generate.png"
        assert main(["generate", "--model", str(folder), "--prompt", "a cat", "--height", "32",
                     "--width", "32", "--steps", "2", "--seed", "3", "--output", str(out),
                     "--no-progress", SEQ, f"compile_cache={srv.cache}"]) == 0
        capsys.readouterr()
        assert png == out.read_bytes()
        again = srv.wait(srv.call("POST", "/v1/videos", {**BODY, "seed": 4})[2]["id"])
        assert again["status"] == "completed" and again["compiles"] == 0, again
        assert not list(srv.out.glob(".*partial*"))
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-2000:]
