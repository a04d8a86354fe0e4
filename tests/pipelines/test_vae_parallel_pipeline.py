"""``load_pipeline(..., vae_parallel=True)``: the pipeline's decode with each frame's rows split
over the mesh (:mod:`ditax.models.vae.parallel`) gives the one-device decode's video (the demo
Wan model on context 8, a height of 6 latent rows over 8 devices); what it cannot do is one
line before any weights."""

import numpy as np
import pytest

import ditax
from ditax.errors import ConfigError
from ditax.parallel.mesh import make_mesh

DEMO = "src/ditax/assets/demo_model"


def test_parallel_decode_in_the_pipeline_equals_one_device():
    mesh = make_mesh(dict(context=8))
    a = ditax.load_pipeline(DEMO, mesh=mesh)
    b = ditax.load_pipeline(DEMO, mesh=mesh, vae_parallel=True)
    call = dict(num_inference_steps=2, seed=0, num_frames=5, height=48, width=32,
                progress=False)
    want, got = np.asarray(a("a red ball", **call)), np.asarray(b("a red ball", **call))
    assert got.shape == want.shape == (5, 48, 32, 3)
    np.testing.assert_allclose(got, want, atol=2e-6)


@pytest.mark.parametrize("kw, words", [
    (dict(), "pass a mesh of several devices"),
    (dict(mesh="8", vae_tiling=True), "choose one"),
])
def test_what_parallel_decode_cannot_do_is_one_line(kw, words):
    kw = dict(kw)
    if kw.pop("mesh", None):
        kw["mesh"] = make_mesh(dict(context=8))
    with pytest.raises(ConfigError, match=words) as e:
        ditax.load_pipeline(DEMO, vae_parallel=True, **kw)
    assert len(str(e.value).splitlines()) == 1


def test_a_family_without_a_row_split_decode_is_refused():
    from ditax.pipelines.family import PipelineFamily
    from ditax.pipelines.load import check_vae_parallel

    class NoSplit(PipelineFamily):     # a family that declares no row-split decode
        name = "toy"

    with pytest.raises(ConfigError, match="toy pipelines have no row-split VAE decode"):
        check_vae_parallel(NoSplit, make_mesh(dict(context=8)), {})
