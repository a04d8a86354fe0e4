"""A tiny random FLUX.1 transformer for the LoRA tests (two double and three single blocks:
stacks of different depths), diffusers' way of reading a LoRA file into it, and small helpers."""

from __future__ import annotations

import numpy as np
import pytest

from flux_reference import DEV, flux_inputs, make_diffusers_flux, run_diffusers_flux

CFG = {k: v for k, v in DEV.items() if k != "out_channels"} | dict(num_single_layers=3)
TOL = 1e-5
D = CFG["num_attention_heads"] * CFG["attention_head_dim"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from diffusers import FluxTransformer2DModel

    _, folder = make_diffusers_flux(tmp_path_factory.mktemp("flux"), seed=5, **CFG)
    inputs = flux_inputs(np.random.default_rng(1), CFG, b=1, text=5, guidance=True)

    def fresh():
        return FluxTransformer2DModel.from_pretrained(folder).eval()

    return folder, fresh, inputs, run_diffusers_flux(fresh(), inputs)


def diffusers_run(fresh, inputs, path, scale):
    """diffusers' own reading of ``path`` (any Flux format), fused at ``scale``, run."""
    from diffusers import FluxPipeline

    m = fresh()
    sd = FluxPipeline.lora_state_dict(str(path))
    m.load_lora_adapter(sd, adapter_name="a", prefix="transformer")
    m.fuse_lora(lora_scale=scale)
    return run_diffusers_flux(m, inputs)


def ours(folder, inputs, **kw):
    """ditax's transformer from ``folder`` (``kw``: loras, lora_mode …) run on ``inputs``."""
    import ditax

    return np.asarray(ditax.load_transformer(folder, **kw)(**inputs))


def pair(rng, r, din, dout, size=0.15):
    a = np.sqrt(size / np.sqrt(r * din))
    return ((a * rng.standard_normal((r, din))).astype(np.float32),
            (a * rng.standard_normal((dout, r))).astype(np.float32))


def save(path, tensors):
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    return path
