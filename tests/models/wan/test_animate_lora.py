"""LoRAs on the Wan 2.2 Animate transformer: a random diffusers / PEFT LoRA on main blocks and
on the Animate modules PEFT can wrap (face adapters' and the face encoder's Linear layers, the
face encoder's Conv1d, the pose patch embedding's Conv3d), merged by ``ditax.load_transformer``,
gives diffusers' output with the same LoRA loaded (``load_lora_adapter``) within 1e-5 relative
on one forward; unmerged on the Linear ones equals merged (convs: merged only); names the
Animate model lacks are refused as for Wan."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.errors import WeightError  # noqa: E402
from lora_reference import load_into_diffusers, random_lora, write_peft  # noqa: E402
from test_animate_transformer import _diffusers, _inputs, _ours, animate  # noqa: E402,F401
from wan_reference import rel_err  # noqa: E402


def _conv_lora(model, name, rank, seed, size=0.3):
    """PEFT's factors of a conv LoRA: ``lora_A`` ``[r, in, *k]``, ``lora_B`` ``[out, r, 1..]``."""
    rng = np.random.default_rng(seed)
    w = dict(model.named_modules())[name].weight
    o, i, *k = w.shape
    amp = np.sqrt(size * float(w.detach().abs().mean()) / np.sqrt(rank))
    return dict(down=(amp * rng.standard_normal((rank, i, *k))).astype(np.float32),
                up=(amp * rng.standard_normal((o, rank) + (1,) * len(k))).astype(np.float32),
                alpha=None, bias=None)


def test_lora_on_animate_modules_matches_diffusers(animate, tmp_path):
    import copy

    m, folder, base = animate
    lora = random_lora(m, ["blocks.0.attn1.to_q", "blocks.1.ffn.net.0.proj",
                           "face_adapter.0.to_out", "face_adapter.1.to_k",
                           "face_encoder.out_proj"], rank=2)
    lora["pose_patch_embedding"] = _conv_lora(m, "pose_patch_embedding", 2, 1)
    lora["face_encoder.conv2"] = _conv_lora(m, "face_encoder.conv2", 2, 2)
    path = write_peft(tmp_path / "animate_lora.safetensors", lora)
    tr = ditax.load_transformer(folder, loras=[str(path)])
    ref = copy.deepcopy(m)
    load_into_diffusers(ref, path, "animate")
    wrapped = dict(ref.named_modules())
    assert all(hasattr(wrapped[k], "lora_A") for k in lora), "diffusers dropped a module"
    inp = _inputs(3, b=1)
    want, got = _diffusers(ref, inp), _ours(tr, inp)
    err = rel_err(got, want)
    print(f"animate LoRA (merged) vs diffusers' load_lora_adapter: rel err {err:.2e}")
    assert err < 1e-5, err
    assert rel_err(want, _ours(base, inp)) > 1e-3      # the LoRA changes the output
    # each Animate module's update is in: without it the output differs
    for name in ("pose_patch_embedding", "face_encoder.conv2", "face_adapter.1.to_k"):
        less = write_peft(tmp_path / "less.safetensors",
                          {k: v for k, v in lora.items() if k != name})
        w = ditax.load_transformer(folder, loras=[str(less)]).module
        assert not np.allclose(_weight(w, name), _weight(tr.module, name)), name


def test_unmerged_on_animate_linears(animate, tmp_path):
    """``lora_mode="unmerged"``: the face adapters' and face encoder's Linear layers take
    run-time LoRAs equal to the merged ones; a conv LoRA is refused (merged only)."""
    m, folder, _ = animate
    lora = random_lora(m, ["blocks.0.attn1.to_q", "face_adapter.0.to_out",
                           "face_adapter.1.to_k", "face_encoder.out_proj"], rank=2)
    path = write_peft(tmp_path / "linears.safetensors", lora)
    inp = _inputs(4, b=1)
    merged = _ours(ditax.load_transformer(folder, loras=[str(path)]), inp)
    unmerged = _ours(ditax.load_transformer(folder, loras=[str(path)], lora_mode="unmerged"),
                     inp)
    assert rel_err(unmerged, merged) < 1e-5, rel_err(unmerged, merged)
    lora["pose_patch_embedding"] = _conv_lora(m, "pose_patch_embedding", 2, 1)
    conv = write_peft(tmp_path / "conv.safetensors", lora)
    with pytest.raises(WeightError, match=r"pose_patch_embedding.weight is a full delta.*"
                                          r"load it merged"):
        ditax.load_transformer(folder, loras=[str(conv)], lora_mode="unmerged")


def _weight(module, name):
    return np.asarray({"pose_patch_embedding": module.pose_patch_embedding_kernel,
                       "face_encoder.conv2": module.face_encoder.conv2_kernel,
                       "face_adapter.1.to_k": module.face_adapter.to_k.kernel}[name][...])


@pytest.mark.parametrize("module,match", [
    ("motion_encoder.motion_network.0", r"2 key\(s\) match no layer.*motion_network"),
    ("face_adapter.0.to_z", r"match no layer.*face_adapter\.0\.to_z"),
    ("face_adapter.2.to_q", r"face_adapter\.2\.to_q: no such weight"),
])
def test_unknown_animate_names_refused(animate, tmp_path, module, match):
    """Beside a block's LoRA: a motion-encoder layer (no PEFT LoRA names it), a face-adapter
    module that does not exist, and a face adapter past the model's two."""
    m, folder, _ = animate
    r = np.random.default_rng(0)
    lora = random_lora(m, ["blocks.0.attn1.to_q"], rank=2)
    lora[module] = dict(down=r.standard_normal((2, 32)).astype(np.float32),
                        up=r.standard_normal((32, 2)).astype(np.float32), alpha=None, bias=None)
    path = write_peft(tmp_path / "bad.safetensors", lora)
    with pytest.raises(WeightError, match=match):
        ditax.load_transformer(folder, loras=[str(path)])
