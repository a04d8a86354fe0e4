"""Flux through every local attention kernel: xla, blockwise, flash and splash on the joint
sequence with a text mask (equal to diffusers on the unpadded text), cuDNN by CUDA lowering
(forward and gradient reach the fused kernels), TransformerEngine through its recording
stand-in, and the refusal of length-mask kernels where the joint mask is no prefix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cuda_probes
import ditax
import te_fake
from cuda_probes import BWD, FWD, cuda_hlo
from ditax.config import AttentionConfig
from ditax.errors import RequestError
from ditax.parallel import make_mesh
from flux_reference import TINY, flux_inputs, make_diffusers_flux, run_diffusers_flux
from wan_reference import rel_err

REAL_TEXT = 4    # of 7 text tokens; the rest is padding the text mask hides


@pytest.fixture(scope="module")
def model(tmp_path_factory, fast_compile):
    return make_diffusers_flux(tmp_path_factory.mktemp("flux_attn"), **TINY)


@pytest.fixture(scope="module")
def masked(model):
    """Inputs with 3 padded text tokens (random values, masked) and diffusers' output on the
    4 real ones."""
    inputs = flux_inputs(np.random.default_rng(3), TINY, b=2, image=16, text=7)
    short = dict(inputs, encoder_hidden_states=inputs["encoder_hidden_states"][:, :REAL_TEXT],
                 txt_ids=inputs["txt_ids"][:REAL_TEXT])
    mask = np.arange(7)[None, :] < np.array([[REAL_TEXT], [REAL_TEXT]])
    return dict(inputs, text_mask=mask), run_diffusers_flux(model[0], short)


@pytest.mark.parametrize("acfg", [
    AttentionConfig(backend="xla"),
    AttentionConfig(backend="blockwise", block_kv=8),
    AttentionConfig(backend="flash", block_q=8, block_kv=8),
    AttentionConfig(backend="splash"),
], ids=["xla", "blockwise", "flash", "splash"])
def test_local_kernels_with_a_text_mask_equal_diffusers_on_the_unpadded_text(model, masked,
                                                                             acfg):
    inputs, ref = masked
    out = np.asarray(ditax.load_transformer(model[1], attention=acfg)(**inputs))
    assert rel_err(out, ref) <= 1e-5, rel_err(out, ref)


def test_cudnn_forward_and_gradient_lower_to_the_fused_kernels(model, masked):
    """bf16 on an H200 target: one device with the text mask (image first: a prefix mask,
    given as key lengths) and Ulysses over 2 context shards on unpadded streams."""
    inputs, _ = masked
    bf = {k: jnp.asarray(v, jnp.bfloat16) if v.dtype == np.float32 and "ids" not in k else v
          for k, v in inputs.items()}
    with cuda_probes.h200():
        for mesh, acfg, drop in ((None, "cudnn", ()),
                                 (make_mesh({"context": 2, "fsdp": 2}, jax.devices()[:4]),
                                  AttentionConfig(backend="ulysses", local="cudnn"),
                                  ("text_mask",))):
            tr = ditax.load_transformer(model[1], dtype="bfloat16", mesh=mesh, attention=acfg)
            x = {k: v for k, v in bf.items() if k not in drop}
            if mesh is not None:                     # 16 image + 8 text tokens: no padding
                x.update(encoder_hidden_states=jnp.zeros((2, 8, 32), jnp.bfloat16),
                         txt_ids=np.zeros((8, 3), np.float32))
            fwd = cuda_hlo(lambda tr, h: tr(**{**x, "hidden_states": h}), tr, x["hidden_states"])
            assert FWD in fwd and BWD not in fwd
            bwd = cuda_hlo(jax.grad(lambda tr, h: jnp.sum(
                tr(**{**x, "hidden_states": h}).astype(jnp.float32)), argnums=(0, 1)),
                tr, x["hidden_states"])
            assert FWD in bwd and BWD in bwd


def test_length_mask_kernels_are_refused_where_the_joint_mask_is_no_prefix(model, masked):
    inputs, _ = masked
    mesh = make_mesh({"context": 2, "fsdp": 2}, jax.devices()[:4])
    with cuda_probes.h200():
        tr = ditax.load_transformer(model[1], dtype="bfloat16", mesh=mesh,
                                    attention=AttentionConfig(backend="ulysses", local="cudnn"))
        with pytest.raises(RequestError, match=r"'cudnn' takes key masks as lengths .* on 2 "
                                               r"context shards .*15 image tokens are not a "
                                               r"multiple of the 2 context shards; a text_mask"):
            tr(**{**inputs, "hidden_states": inputs["hidden_states"][:, :15],
                  "img_ids": inputs["img_ids"][:15]})


@pytest.fixture
def fake_te(monkeypatch):
    from ditax.attention import platform

    monkeypatch.delenv("NVTE_FUSED_ATTN", raising=False)
    yield te_fake.install(monkeypatch)
    platform.module_available.cache_clear()


def test_te_gets_the_joint_text_mask_as_key_lengths(model, masked, fake_te):
    """TransformerEngine (the recording stand-in, computing attention from the key lengths it
    is given): with the text mask, every block's joint attention is a padding-masked call
    whose lengths (16 image + 4 real text of 23 keys) give diffusers' output on the unpadded
    text; without the mask the padded text tokens are attended and the output differs."""
    from ditax.attention.te import configure_te

    inputs, ref = masked
    bf = {k: v.astype(jnp.bfloat16) if k in ("hidden_states", "encoder_hidden_states",
                                              "pooled_projections") else v
          for k, v in inputs.items()}
    with ditax.target_platform("cuda", compute_capability=(9, 0)), configure_te(None):
        tr = ditax.load_transformer(model[1], dtype="bfloat16", attention="te")
        out = np.asarray(tr(**bf), np.float32)
        calls = list(fake_te)
        unmasked = np.asarray(tr(**{**bf, "text_mask": None}), np.float32)
    assert rel_err(out, ref) <= 2e-2, rel_err(out, ref)          # bfloat16 end to end
    assert rel_err(unmasked, ref) > 5 * rel_err(out, ref)
    assert len(calls) == 2                                       # one double, one single block
    for call in calls:
        assert call["kwargs"]["attn_mask_type"] == "padding"
        assert call["shapes"][1] == (2, 16 + 7, 2, 16)           # [B, S', N, K] joint keys
