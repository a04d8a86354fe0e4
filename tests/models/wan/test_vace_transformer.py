"""Wan VACE transformer vs diffusers' ``WanVACETransformer3DModel`` (tiny random model saved
with save_pretrained, loaded with ditax): forward within 1e-5 relative in float32 (control
context shorter than the latents: zero-padded tokens; per-layer scales), context-ulysses x fsdp
on 8 devices equal to one device with its gradients (inputs and every parameter) equal to
torch autograd, strict key checks, bad control inputs."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.config import AttentionConfig  # noqa: E402
from ditax.errors import ConfigError, WeightError  # noqa: E402
from ditax.parallel import make_mesh  # noqa: E402
from wan_reference import rel_err  # noqa: E402

C, CV, TEXT = 4, 12, 32


def make_vace(folder, *, layers=3, vace_layers=(2, 0), seed=0):
    """A random ``WanVACETransformer3DModel`` (every parameter randomised), saved."""
    from diffusers import WanVACETransformer3DModel

    torch.manual_seed(seed)
    m = WanVACETransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=8, in_channels=C,
        out_channels=C, text_dim=TEXT, freq_dim=32, ffn_dim=48, num_layers=layers,
        cross_attn_norm=True, vace_layers=list(vace_layers), vace_in_channels=CV)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / max(1, p.shape[-1]) ** 0.5)
                    + (1.0 if name.endswith(("norm_q.weight", "norm_k.weight")) else 0.0))
    m.eval()
    m.save_pretrained(folder)
    return m


@pytest.fixture(scope="module")
def vace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vace") / "transformer"
    return make_vace(folder), folder


def _inputs(b=2, f=3, y=6, x=10, fc=None, seed=0):
    r = np.random.default_rng(seed)
    lat = r.standard_normal((b, C, f, y, x)).astype(np.float32)
    t = np.array([700.0, 250.0][:b], np.float32)
    text = r.standard_normal((b, 7, TEXT)).astype(np.float32)
    ctrl = r.standard_normal((b, CV, fc or f, y, x)).astype(np.float32)
    return lat, t, text, ctrl


def _reference(m, lat, t, text, ctrl, scale):
    with torch.no_grad():
        return m(torch.from_numpy(lat), torch.from_numpy(t), torch.from_numpy(text),
                 control_hidden_states=torch.from_numpy(ctrl),
                 control_hidden_states_scale=torch.tensor(scale),
                 return_dict=False)[0].numpy()


@pytest.fixture(scope="module")
def single(vace):
    """One device, one compile: inputs (2 control frames for 3 latent frames: padded tokens),
    scales [0.5, 1.5] and [1, 1] → (inputs, outputs)."""
    _, folder = vace
    tr = ditax.load_transformer(folder)
    lat, t, text, ctrl = _inputs(fc=2)
    outs = {s: np.asarray(tr(lat, t, text, control_hidden_states=ctrl,
                             control_hidden_states_scale=np.float32(s)))
            for s in ((0.5, 1.5), (1.0, 1.0))}
    return tr, (lat, t, text, ctrl), outs


def test_forward_matches_diffusers(vace, single):
    m, _ = vace
    tr, (lat, t, text, ctrl), outs = single
    assert type(tr).__name__ == "VaceTransformer"
    assert tr.config.vace_layers == (2, 0) and tr.config.hint_layers == (0, 2)
    for scale, got in outs.items():
        err = rel_err(got, _reference(m, lat, t, text, ctrl, list(scale)))
        print(f"VACE forward vs diffusers (scale {scale}): rel err {err:.2e}")
        assert err <= 1e-5, err
    # the control branch matters: another scale, another output
    assert rel_err(outs[(1.0, 1.0)], outs[(0.5, 1.5)]) > 1e-3


def test_context_ulysses_equals_one_device_and_gradients_match(vace, single):
    """The control tokens' attention goes through the model's attention plan: ulysses on
    context 4 x fsdp 2 (L = 45 tokens: padded to the 4 shards) equals one device; its gradient
    w.r.t. the latents, the control context and every parameter (VACE blocks included)
    matches torch autograd."""
    import jax
    import jax.numpy as jnp

    from ditax.io.convert import export
    from ditax.models.wan.vace_convert import config_weight_table

    m, folder = vace
    _, (lat, t, text, ctrl), outs = single
    tr = ditax.load_transformer(folder, mesh=make_mesh({"context": 4, "fsdp": 2}),
                                attention=AttentionConfig(backend="ulysses", local="xla"))
    k = tr.module.vace_blocks.attn1.to_q.kernel[...]
    assert k.sharding.shard_shape(k.shape) != k.shape     # the VACE blocks are sharded too
    ct = np.random.default_rng(5).standard_normal(lat.shape).astype(np.float32)

    @jax.jit
    def out_and_grads(tr, lat, ctrl):
        out, pull = jax.vjp(lambda tr, lat, ctrl: tr(lat, t, text, control_hidden_states=ctrl),
                            tr, lat, ctrl)                # scale None: ones
        return out, pull(jnp.asarray(ct))

    out, grads = out_and_grads(tr, jnp.asarray(lat), jnp.asarray(ctrl))
    assert rel_err(out, outs[(1.0, 1.0)]) <= 1e-5, rel_err(out, outs[(1.0, 1.0)])
    m.zero_grad()
    leaves = [torch.from_numpy(lat).requires_grad_(), torch.from_numpy(ctrl).requires_grad_()]
    ref = m(leaves[0], torch.from_numpy(t), torch.from_numpy(text),
            control_hidden_states=leaves[1], return_dict=False)[0]
    (ref * torch.from_numpy(ct)).sum().backward()
    for name, g, want in zip(("latents", "control"), grads[1:], leaves):
        assert rel_err(g, want.grad.numpy()) <= 1e-5, name
    ours = export(config_weight_table(tr.config), grads[0]._state)
    theirs = {k: p.grad.numpy() for k, p in m.named_parameters() if p.grad is not None}
    assert any(k.startswith("vace_blocks.1.") for k in theirs) and set(theirs) <= set(ours)
    errs = {k: rel_err(ours[k], theirs[k]) for k in theirs}
    print(f"VACE gradients vs torch (ulysses mesh): max rel err {max(errs.values()):.2e}")
    assert max(errs.values()) <= 1e-5, {k: e for k, e in errs.items() if e > 1e-5}


def test_tensor_heads_and_mlp_equal_one_device(vace, single):
    """tensor 2 (heads and MLPs split, the VACE blocks' too) x ulysses on context 2 x fsdp 2:
    the forward with control tokens equals one device."""
    import jax

    _, folder = vace
    _, (lat, t, text, ctrl), outs = single
    tr = ditax.load_transformer(folder, mesh=make_mesh({"tensor": 2, "context": 2, "fsdp": 2}),
                                attention=AttentionConfig(backend="ulysses", local="xla"))
    k = tr.module.vace_blocks.attn1.to_q.kernel[...]
    assert "tensor" in jax.tree.leaves(tuple(k.sharding.spec))   # VACE heads split too
    out = np.asarray(tr(lat, t, text, control_hidden_states=ctrl))
    err = rel_err(out, outs[(1.0, 1.0)])
    print(f"VACE tensor2 x ulysses2 x fsdp2 vs one device: rel err {err:.2e}")
    assert err <= 1e-5, err


def test_strict_keys_and_bad_inputs(vace, tmp_path):
    m, folder = vace
    cfg = json.loads((folder / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in folder.iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    (bad / "config.json").write_text(json.dumps({**cfg, "vace_layers": [0, 1, 2]}))
    with pytest.raises(WeightError, match=r"vace_blocks\.2\."):
        ditax.load_transformer(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "vace_layers": [1, 2]}))
    with pytest.raises(ConfigError, match=r"vace_layers=\[1, 2\] must include layer 0"):
        ditax.load_transformer(bad)
    tr = ditax.load_transformer(folder)
    lat, t, text, ctrl = _inputs()
    with pytest.raises(ValueError, match=r"control_hidden_states must be \[B=2, "
                                         r"vace_in_channels=12, F<=3, 6, 10\]"):
        tr(lat, t, text, control_hidden_states=ctrl[:, :, :, :4])
    with pytest.raises(ValueError, match=r"needs control_hidden_states"):
        tr(lat, t, text)
    with pytest.raises(ValueError, match=r"control_hidden_states_scale must be \[2\]"):
        tr(lat, t, text, control_hidden_states=ctrl, control_hidden_states_scale=np.ones(3))


def test_lora_on_vace_blocks_merges_as_diffusers(vace, tmp_path):
    """A diffusers / PEFT LoRA on the VACE blocks (``vace_blocks.N.*``: attention, FFN, block
    0's proj_in, proj_out) and a main block loads merged; every updated weight equals the one
    diffusers' loader fuses (weights only: no forward to compile)."""
    import copy

    from lora_reference import load_into_diffusers, random_lora, write_peft

    m, folder = vace
    lora = random_lora(m, ["vace_blocks.0.proj_in", "vace_blocks.1.proj_out",
                           "vace_blocks.1.attn1.to_q", "vace_blocks.0.ffn.net.2",
                           "blocks.1.attn2.to_v"], rank=2, alpha=1.0)
    path = write_peft(tmp_path / "vace_lora.safetensors", lora)
    mod = ditax.load_transformer(folder, loras=[str(path)]).module
    ref = copy.deepcopy(m)
    load_into_diffusers(ref, path, "vace")
    ref.fuse_lora()
    want = {k.replace(".base_layer", ""): v.detach().numpy()
            for k, v in ref.state_dict().items()}
    got = {"vace_blocks.0.proj_in": mod.vace_proj_in.kernel[...],
           "vace_blocks.1.proj_out": mod.vace_blocks.proj_out.kernel[1],
           "vace_blocks.1.attn1.to_q": mod.vace_blocks.attn1.to_q.kernel[1],
           "vace_blocks.0.ffn.net.2": mod.vace_blocks.ffn.proj_out.kernel[0],
           "blocks.1.attn2.to_v": mod.blocks.attn2.to_v.kernel[1]}
    base = dict(m.named_parameters())
    for name, k in got.items():
        w, k = want[name + ".weight"], np.asarray(k)
        if k.ndim == 3:   # attention kernels are head-major [heads, in, head_dim]
            k = k.transpose(1, 0, 2).reshape(k.shape[1], -1)
        assert rel_err(k.T, w) <= 1e-6, name
        assert rel_err(w, base[name + ".weight"].detach().numpy()) > 1e-2, name  # it changed


def test_convert_checks_a_vace_folder(vace, tmp_path, capsys):
    """``ditax convert FOLDER`` reads a VACE folder as VACE (its ``_class_name``): its VACE keys
    are expected (OK); a VACE block missing from the weights is named (exit 2)."""
    from ditax.cli import main as cli_main

    _, folder = vace
    assert cli_main(["convert", str(folder)]) == 0
    assert "OK — 3 layers, D=32, 4 heads x 8" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in folder.iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "vace_layers": [0, 1, 2]}))
    assert cli_main(["convert", str(bad)]) == 2
    assert "vace_blocks.2." in capsys.readouterr().err
