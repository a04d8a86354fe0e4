"""Random Wan LoRA files in every supported format, and diffusers' way of loading them (torch).

A LoRA is first made as ``{diffusers module: (down [r, in], up [out, r], alpha, bias)}`` from a
diffusers model's Linear shapes, then written with the key names of one format.
"""

from __future__ import annotations

import numpy as np

from ditax.models.wan.original_names import to_original

BLOCK_LINEARS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q",
                 "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2")
TOP_LINEARS = ("condition_embedder.time_proj", "condition_embedder.text_embedder.linear_1",
               "condition_embedder.text_embedder.linear_2",
               "condition_embedder.time_embedder.linear_1",
               "condition_embedder.time_embedder.linear_2", "proj_out")


def block_modules(layers: int, names=BLOCK_LINEARS) -> list[str]:
    return [f"blocks.{i}.{n}" for i in range(layers) for n in names]


def random_lora(model, modules, *, rank=4, alpha=None, bias=False, seed=0, size=0.3):
    """``{module: dict(down, up, alpha, bias)}`` for the named Linear modules of ``model``:
    random factors whose update is ~``size`` of the weight (so a wrong mapping shows)."""
    rng = np.random.default_rng(seed)
    mods = dict(model.named_modules())
    out = {}
    for name in modules:
        o, i = mods[name].weight.shape
        w = float(mods[name].weight.detach().abs().mean())
        r = rank if isinstance(rank, int) else rank[len(out) % len(rank)]
        a = alpha if alpha is None or np.isscalar(alpha) else alpha[len(out) % len(alpha)]
        eff = 1.0 if a is None else a / r
        amp = np.sqrt(size * w / (eff * np.sqrt(r)))
        out[name] = dict(down=(amp * rng.standard_normal((r, i))).astype(np.float32),
                         up=(amp * rng.standard_normal((o, r))).astype(np.float32),
                         alpha=a, bias=((0.1 * w) * rng.standard_normal(o)).astype(np.float32)
                         if bias else None)
    return out


def demo_lora(modules=("attn1.to_q", "attn1.to_v"), *, layers: int = 4, width: int = 320,
              rank: int = 4, seed: int = 0) -> dict:
    """A random LoRA (``{module: dict(down, up, alpha=None, bias=None)}``, update scale 1) for
    the shipped demo model's square ``width x width`` Linears ``modules`` of every block."""
    rng = np.random.default_rng(seed)
    return {f"blocks.{i}.{m}": dict(
        down=(0.3 * rng.standard_normal((rank, width))).astype(np.float32),
        up=(0.3 * rng.standard_normal((width, rank))).astype(np.float32), alpha=None, bias=None)
        for i in range(layers) for m in modules}


def write_original(path, lora, *, names=("lora_down", "lora_up"), prefix="diffusion_model.",
                   extra=None):
    """Original Wan / ComfyUI keys (``diffusion_model.blocks.0.self_attn.q.lora_down.weight``)."""
    from safetensors.numpy import save_file

    t = {}
    for module, p in lora.items():
        o = prefix + to_original(module)
        t[f"{o}.{names[0]}.weight"], t[f"{o}.{names[1]}.weight"] = p["down"], p["up"]
        if p["alpha"] is not None:
            t[f"{o}.alpha"] = np.asarray(p["alpha"], np.float32)
        if p["bias"] is not None:
            t[f"{o}.diff_b"] = p["bias"]
    t.update(extra or {})
    save_file(t, str(path))
    return path


def write_musubi(path, lora):
    """musubi-tuner / kohya keys (``lora_unet_blocks_0_self_attn_q.lora_down.weight``)."""
    from safetensors.numpy import save_file

    t = {}
    for module, p in lora.items():
        o = "lora_unet_" + to_original(module).replace(".", "_")
        t[f"{o}.lora_down.weight"], t[f"{o}.lora_up.weight"] = p["down"], p["up"]
        t[f"{o}.alpha"] = np.asarray(p["alpha"], np.float32)
    save_file(t, str(path))
    return path


def write_peft(path, lora):
    """diffusers / PEFT keys (``transformer.blocks.0.attn1.to_q.lora_A.weight``)."""
    from safetensors.numpy import save_file

    t = {}
    for module, p in lora.items():
        t[f"transformer.{module}.lora_A.weight"] = p["down"]
        t[f"transformer.{module}.lora_B.weight"] = p["up"]
        if p["bias"] is not None:
            t[f"transformer.{module}.lora_B.bias"] = p["bias"]
    save_file(t, str(path))
    return path


def load_into_diffusers(model, path, name, scale=None):
    """Load a LoRA file of any format into a diffusers Wan transformer as adapter ``name``
    (diffusers' own conversion, ``WanPipeline.lora_state_dict``), optionally at ``scale``."""
    from diffusers import WanPipeline

    sd = WanPipeline.lora_state_dict(str(path))
    model.load_lora_adapter(sd, adapter_name=name, prefix="transformer")
    if scale is not None:
        model.set_adapters([name], [scale])
