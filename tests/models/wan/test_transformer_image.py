"""Wan 2.1 image-to-video / first-last-frame transformer: parity with diffusers, meshes, export.

diffusers splits the image tokens off the cross-attention context as ``len - 512``, so the
text here is always 512 tokens long.
"""

import numpy as np
import pytest
import torch

import ditax
from ditax.config import AttentionConfig, Config, ConfigError, ModelConfig, validate
from ditax.io.convert import export
from ditax.models.wan import convert
from ditax.parallel import make_mesh
from wan_image_model import (IMAGE_DIM, IMAGE_TOKENS, image_inputs, make_i2v,
                             run_diffusers_image)
from wan_reference import rel_err

@pytest.mark.parametrize("flf2v", [False, True], ids=["i2v", "flf2v"])
def test_parity_with_diffusers(tmp_path, rng, flf2v):
    m, folder = make_i2v(tmp_path, flf2v=flf2v)
    args = image_inputs(rng, flf2v=flf2v)
    ref = run_diffusers_image(m, *args)
    tr = ditax.load_transformer(folder)
    assert tr.config.image_dim == IMAGE_DIM and tr.config.in_channels == 36
    assert tr.config.pos_embed_seq_len == (2 * IMAGE_TOKENS if flf2v else None)
    out = np.asarray(tr(*args[:3], encoder_hidden_states_image=args[3]))
    assert out.shape == ref.shape == (2, 16, 3, 6, 10)
    err = rel_err(out, ref)
    print(f"i2v parity ({'flf2v' if flf2v else 'i2v'}): rel err {err:.2e}")
    assert err <= 1e-5, err
    # the image matters (a wrong wiring that ignored it would still pass the text path)
    other = np.asarray(tr(*args[:3], encoder_hidden_states_image=args[3][::-1].copy()))
    assert rel_err(other, ref) > 1e-3


def test_export_round_trips_the_new_parameters(tmp_path):
    """The weight table goes both ways: exporting gives diffusers' keys and tensors."""
    m, folder = make_i2v(tmp_path, flf2v=True, layers=1)
    tr = ditax.load_transformer(folder)
    out = export(convert.config_weight_table(tr.config), tr.module)
    ref = {k: v.numpy() for k, v in m.state_dict().items()}
    assert set(out) == set(ref)
    for k in ("condition_embedder.image_embedder.pos_embed",
              "condition_embedder.image_embedder.ff.net.0.proj.weight",
              "condition_embedder.image_embedder.norm1.bias",
              "blocks.0.attn2.add_k_proj.weight", "blocks.0.attn2.norm_added_k.weight"):
        np.testing.assert_array_equal(out[k], ref[k])


@pytest.mark.parametrize("mesh_kw,acfg", [
    ({"context": 8}, AttentionConfig(backend="ulysses", local="xla")),
    ({"context": 4, "fsdp": 2}, AttentionConfig(backend="ulysses", local="flash", block_q=8,
                                                block_kv=8)),
], ids=["ulysses-ctx8", "ulysses-flash-ctx4xfsdp2"])
def test_mesh_equals_single_device(tmp_path, rng, mesh_kw, acfg):
    """Image K/V are replicated like the text under context parallelism (L=45: padded)."""
    m, folder = make_i2v(tmp_path, flf2v=True, heads=8, head_dim=8)
    lat, t, text, image = image_inputs(rng, flf2v=True)
    one = np.asarray(ditax.load_transformer(folder)(lat, t, text,
                                                    encoder_hidden_states_image=image))
    tr = ditax.load_transformer(folder, mesh=make_mesh(dict(mesh_kw)), attention=acfg)
    out = np.asarray(tr(lat, t, text, encoder_hidden_states_image=image))
    err = rel_err(out, one)
    print(f"i2v mesh {mesh_kw}: rel err vs one device {err:.2e}, vs diffusers "
          f"{rel_err(out, run_diffusers_image(m, lat, t, text, image)):.2e}")
    assert err <= 1e-5, err


def test_bad_inputs_and_configs(tmp_path, rng):
    _, folder = make_i2v(tmp_path, layers=1)
    tr = ditax.load_transformer(folder)
    lat, t, text, image = image_inputs(rng)
    with pytest.raises(ValueError, match="needs encoder_hidden_states_image"):
        tr(lat, t, text)
    with pytest.raises(ValueError, match="image_dim=24"):
        tr(lat, t, text, encoder_hidden_states_image=image[..., :8])
    with pytest.raises(ValueError, match="batch 1"):
        tr(lat, t, text, encoder_hidden_states_image=image[:1])
    base = dict(num_attention_heads=2, attention_head_dim=16)
    with pytest.raises(ConfigError, match="set together"):
        validate(Config(model=ModelConfig(image_dim=8, **base)))
    with pytest.raises(ConfigError, match="must equal the model width"):
        validate(Config(
            model=ModelConfig(image_dim=8, added_kv_proj_dim=16, **base)))
    with pytest.raises(ConfigError, match="needs model.image_dim"):
        validate(Config(model=ModelConfig(pos_embed_seq_len=4, **base)))


@pytest.mark.parametrize("mesh_kw", [None, {"context": 4, "fsdp": 2}], ids=["one", "ctx4xfsdp2"])
def test_per_token_timesteps_match_diffusers(tmp_path, rng, mesh_kw):
    """Wan 2.2 TI2V: timestep ``[B, L]`` (the first latent frame's tokens at t=0) gives each
    token its own modulation, as diffusers' ``timestep.ndim == 2`` path; L=45 pads under
    context=4, so the per-token table is padded and sharded with its tokens."""
    from wan_reference import make_diffusers_wan

    m, folder = make_diffusers_wan(tmp_path, heads=4, head_dim=8, in_ch=8, seed=3)
    b, f, y, x = 2, 3, 6, 10
    lat = rng.standard_normal((b, 8, f, y, x)).astype(np.float32)
    text = rng.standard_normal((b, 7, 32)).astype(np.float32)
    per_frame = np.stack([np.zeros(b), *rng.uniform(0, 1000, (f - 1, b))], 1)  # [B, F]
    t = np.repeat(per_frame, (y // 2) * (x // 2), axis=1).astype(np.float32)   # [B, L]
    with torch.no_grad():
        ref = m(torch.from_numpy(lat), torch.from_numpy(t), torch.from_numpy(text),
                return_dict=False)[0].numpy()
    kw = {} if mesh_kw is None else dict(mesh=make_mesh(dict(mesh_kw)),
                                         attention=AttentionConfig(backend="ulysses"))
    tr = ditax.load_transformer(folder, **kw)
    out = np.asarray(tr(lat, t, text))
    err = rel_err(out, ref)
    print(f"per-token timesteps ({mesh_kw}): rel err {err:.2e}")
    assert err <= 1e-5, err
    # tokens really get their own timestep: one timestep per sample gives another output
    flat = np.asarray(tr(lat, t[:, -1], text))
    assert rel_err(flat, ref) > 1e-3
    with pytest.raises(ValueError, match=r"per token \[B=2, L=45\]"):
        tr(lat, t[:, :-1], text)
