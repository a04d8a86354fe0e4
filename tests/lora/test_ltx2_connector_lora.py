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


def _lora_file(path, form, rng, sd_t, sd_c):
    """A LoRA on the transformer's block-0 ``attn1.to_q``, the connectors' ``text_proj_in``
    and the video connector's block-0 ``to_k``, in the original keys or diffusers' PEFT keys;
    returns the path and ``{(part, key): up @ down}``."""
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
        parts = ("lora_down", "lora_up")
    else:
        names = {"transformer.transformer_blocks.0.attn1.to_q": (dq, uq),
                 "connectors.text_proj_in": (dp, up),
                 "connectors.video_connector.transformer_blocks.0.attn1.to_k": (dk, uk)}
        parts = ("lora_A", "lora_B")
    tensors = {f"{n}.{parts[0]}.weight": d for n, (d, _) in names.items()}
    tensors |= {f"{n}.{parts[1]}.weight": u for n, (_, u) in names.items()}
    deltas = {("t", q): uq @ dq, ("c", p): up @ dp, ("c", k): uk @ dk}
    return _write(path, tensors), deltas


def test_connector_rows_merge_into_the_connectors(base, tmp_path):
    """Both forms at once (strengths 0.7 and -0.4): each row lands in its own component as
    ``W + s1 · BA (original) + s2 · BA (diffusers)``."""
    root, sd_t, sd_c = base
    rng = np.random.default_rng(3)
    f1, d1 = _lora_file(tmp_path / "original.safetensors", "original", rng, sd_t, sd_c)
    f2, d2 = _lora_file(tmp_path / "diffusers.safetensors", "diffusers", rng, sd_t, sd_c)
    pipe = ditax.load_pipeline(root, loras=[(str(f1), STRENGTH), (str(f2), -0.4)])
    got = _kernels(pipe)
    sd = {"t": sd_t, "c": sd_c}
    for g, key in zip(got, d1):
        want = sd[key[0]][key[1]] + STRENGTH * d1[key] - 0.4 * d2[key]
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6, err_msg=key[1])
    assert np.abs(got[1] - sd_c["text_proj_in.weight"]).max() > 1e-3   # the connector moved


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
