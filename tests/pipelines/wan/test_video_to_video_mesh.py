"""Video-to-video on fsdp 2 (cond / uncond batch) x context 4 (sequence, Ulysses attention):
the source video encoded, noised to strength 0.6 and denoised on the mesh gives the one-device
latents within 1e-5 relative, on test_video_to_video.py's tiny folder and sizes (its module
fixture, built once here). The latents, not the decoded frames: decoding on this mesh is the
text-to-video pipeline's, checked by test_text_to_video.py's mesh case, and would double the
test's compile time."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.config import AttentionConfig  # noqa: E402
from ditax.parallel import make_mesh  # noqa: E402
from test_video_to_video import REQ, _video, tiny  # noqa: E402,F401  (module fixture)


def test_mesh_equals_single_device(tiny):
    _, folder, single = tiny
    pipe = ditax.load_pipeline(folder, video_to_video=True, mesh=make_mesh({"fsdp": 2, "context": 4}),
                               attention=AttentionConfig(backend="ulysses"))
    k = pipe.transformer.module.blocks.attn1.to_q.kernel[...]
    assert k.sharding.shard_shape(k.shape) != k.shape     # parameters really sharded
    kw = dict(REQ, video=_video(4), strength=0.6, progress=False, output="latent")
    got, want = pipe(**kw), single(**kw)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"v2v fsdp2 x context4 vs one device (latents): max rel diff {err:.2e}")
    assert got.shape == want.shape and err <= 1e-5, err
