"""LTX-2 LoRAs that also update the text connectors: the original form
(``diffusion_model.`` + ``text_embedding_projection.aggregate_embed``) and diffusers' PEFT form
(``transformer.`` + ``connectors.``) load through ``ditax.load_pipeline`` with every row where
it belongs — the transformer's in the transformer, the connectors' in the connectors, each
``W + strength · up @ down`` — and a connector key that fits no connector is one line."""

import numpy as np
import pytest
from flax import nnx

import ditax
from ditax.errors import WeightError
from ltx2_pipeline_reference import shared_ltx2_pipeline

pytest.importorskip("diffusers")

STRENGTH = 0.7


def _pair(rng, out_dim, in_dim, rank=2):
    return (rng.standard_normal((rank, in_dim)).astype(np.float32) * 0.1,
            rng.standard_normal((out_dim, rank)).astype(np.float32) * 0.1)


@pytest.fixture(scope="module")
def base():
    root, ref = shared_ltx2_pipeline()
    sd_t = {k: v.numpy() for k, v in ref.transformer.state_dict().items()}
    sd_c = {k: v.numpy() for k, v in ref.connectors.state_dict().items()}
    return root, sd_t, sd_c


def _write(path, tensors):
    from safetensors.numpy import save_file

    save_file(tensors, str(path))
    return path


def _kernels(pipe):
    """(transformer block 0 attn1.to_q, connectors text_proj_in, video connector block 0
    attn1.to_k) weights in torch's [out, in] layout."""
    t = nnx.state(pipe.transformer.module)["transformer_blocks"]["attn1"]["to_q"]["kernel"][...]
    c = nnx.state(pipe.text.connectors)
    proj = c["text_proj_in"]["kernel"][...]
    to_k = c["video_connector"]["transformer_blocks"][0]["attn1"]["to_k"]["kernel"][...]
    return np.asarray(t)[0].T, np.asarray(proj).T, np.asarray(to_k).T


@pytest.mark.parametrize("form", ["original", "diffusers"])
def test_connector_rows_merge_into_the_connectors(base, tmp_path, form):
    root, sd_t, sd_c = base
    rng = np.random.default_rng(3)
    q = "transformer_blocks.0.attn1.to_q.weight"
    p = "text_proj_in.weight"
    k = "video_connector.transformer_blocks.0.attn1.to_k.weight"
    dq, uq = _pair(rng, *sd_t[q].shape)
    dp, up = _pair(rng, *sd_c[p].shape)
    dk, uk = _pair(rng, *sd_c[k].shape)
    if form == "original":
        names = {"diffusion_model.transformer_blocks.0.attn1.to_q": (dq, uq),
                 "text_embedding_projection.aggregate_embed": (dp, up),
                 "text_embedding_projection.video_connector.transformer_blocks.0.attn1.to_k":
                     (dk, uk)}
        tensors = {f"{n}.lora_down.weight": d for n, (d, _) in names.items()}
        tensors |= {f"{n}.lora_up.weight": u for n, (_, u) in names.items()}
    else:
        names = {"transformer.transformer_blocks.0.attn1.to_q": (dq, uq),
                 "connectors.text_proj_in": (dp, up),
                 "connectors.video_connector.transformer_blocks.0.attn1.to_k": (dk, uk)}
        tensors = {f"{n}.lora_A.weight": d for n, (d, _) in names.items()}
        tensors |= {f"{n}.lora_B.weight": u for n, (_, u) in names.items()}
    lora = _write(tmp_path / f"{form}.safetensors", tensors)
    pipe = ditax.load_pipeline(root, loras=[(str(lora), STRENGTH)])
    got = _kernels(pipe)
    want = (sd_t[q] + STRENGTH * uq @ dq, sd_c[p] + STRENGTH * up @ dp,
            sd_c[k] + STRENGTH * uk @ dk)
    for g, w, what in zip(got, want, ("transformer to_q", "text_proj_in", "connector to_k")):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=what)
    assert np.abs(got[1] - sd_c[p]).max() > 1e-3          # the connector rows did change


def test_a_connector_key_that_fits_nothing_is_one_line(base, tmp_path):
    root, sd_t, sd_c = base
    rng = np.random.default_rng(4)
    d, u = _pair(rng, 32, 32)
    name = "connectors.video_connector.transformer_blocks.9.attn1.to_q"
    lora = _write(tmp_path / "bad.safetensors",
                  {f"{name}.lora_A.weight": d, f"{name}.lora_B.weight": u})
    with pytest.raises(WeightError, match="blocks up to 9") as e:
        ditax.load_pipeline(root, loras=[(str(lora), 1.0)])
    assert len(str(e.value).splitlines()) == 1
