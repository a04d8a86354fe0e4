"""``ditax serve`` on the third family of tests/refs/toy_third.py (a plug-in: found in the
server's fresh process through ``DITAX_FAMILIES``): its own JSON field accepted and checked in
the API's words, ``/health`` listing its fields, two same-shape requests run as one batch
through the generic loop, and its second output served as ``?variant=aux``, equal to the
request run alone."""

import concurrent.futures
import importlib
import io
import os
import pathlib

import numpy as np
import pytest
from serve_fixtures import Server

import ditax
from family_scope import families_restored

REFS = pathlib.Path(__file__).resolve().parents[1] / "refs"


@pytest.fixture(scope="module")
def toy():
    with families_restored():
        import toy_third

        yield importlib.reload(toy_third)


def test_serve_takes_checks_and_batches_the_toys_field(toy, tmp_path, monkeypatch):
    folder = toy.write_folder(tmp_path / "pipe")
    # a fresh process finds the plug-in family by DITAX_FAMILIES
    monkeypatch.setenv("DITAX_FAMILIES", "toy_third")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REFS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    srv = Server(tmp_path / "srv", "--max-batch", "2", model=str(folder)).start()
    try:
        for body, param in (({"toy_sharpness": True}, "toy_sharpness"),
                            ({"toy_sharpness": "2"}, "toy_sharpness"),
                            ({"toy_sharpness": 12}, "toy_sharpness"),
                            ({"true_cfg_scale": 2}, "true_cfg_scale"), ({"num_frames": 5}, "num_frames")):
            status, _, data = srv.call("POST", "/v1/videos", {"prompt": "a fox", **body})
            assert status == 400 and data["error"]["param"] == param, data
            assert "--" not in data["error"]["message"], data
        health = srv.call("GET", "/health")[2]
        assert "toy_sharpness" in health["fields"] and "true_cfg_scale" not in health["fields"]
        bodies = [{"prompt": f"a fox {i}", "seed": i, "toy_sharpness": 2.0} for i in range(5)]
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            jobs = list(pool.map(lambda b: srv.call("POST", "/v1/videos", b)[2], bodies))
        done = [srv.wait(j["id"]) for j in jobs]
        assert [d["status"] for d in done] == ["completed"] * 5, done
        assert max(d["batch_size"] for d in done) == 2, [d["batch_size"] for d in done]
        pipe = ditax.load_pipeline(folder)
        for body, job in zip(bodies, done):
            status, head, data = srv.call("GET", job["url"] + "?variant=aux")
            assert status == 200, data
            aux = np.load(io.BytesIO(data))
            want = pipe(body["prompt"], seed=body["seed"], toy_sharpness=2.0, progress=False)
            np.testing.assert_allclose(aux, want["aux"], rtol=1e-4, atol=1e-4)
        status, _, data = srv.call("GET", done[0]["url"] + "?variant=audio")
        assert status == 400 and "aux" in data["error"]["message"], data
    finally:
        srv.stop()
