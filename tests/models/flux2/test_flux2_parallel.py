"""FLUX.2 on 8 devices: sequence-parallel attention over the joint sequence (``ulysses``,
``ring``) with batch and parameters sharded over fsdp equals diffusers on one device, on a
klein-like config (no guidance embedding, out_channels != in_channels, mlp_ratio 2); odd token
counts are padded per context shard and masked."""

import numpy as np
import pytest

import ditax
from ditax.config import AttentionConfig
from ditax.parallel import make_mesh
from flux2_reference import KLEIN, flux2_inputs, make_diffusers_flux2, run_diffusers_flux2
from wan_reference import rel_err

PAR = dict(KLEIN, num_attention_heads=4)      # 4 heads x 16: Ulysses over 4 shards
MESH = {"fsdp": 2, "context": 4}


@pytest.fixture(scope="module")
def model(tmp_path_factory, fast_compile):
    return make_diffusers_flux2(tmp_path_factory.mktemp("flux2_par"), **PAR)


@pytest.fixture(scope="module")
def inputs():
    # 15 image and 5 text tokens: each stream padded on 4 context shards (16 + 8)
    return flux2_inputs(np.random.default_rng(7), PAR, b=2, grid=(3, 5), text=5,
                        guidance=False)


@pytest.mark.parametrize("attention", [
    AttentionConfig(backend="ulysses", local="xla"),
    AttentionConfig(backend="ring", local="blockwise", block_kv=8),
], ids=["ulysses", "ring"])
def test_sequence_parallel_on_fsdp2_x_context4_equals_diffusers(model, inputs, attention):
    tr = ditax.load_transformer(model[1], mesh=make_mesh(MESH), attention=attention)
    k = tr.module.transformer_blocks.attn.to_q.kernel[...]           # [layers, N, D, K]
    assert k.sharding.shard_shape(k.shape)[2] == k.shape[2] // 8      # embed over fsdp x context
    out, ref = np.asarray(tr(**inputs)), run_diffusers_flux2(model[0], inputs)
    print(f"flux2 {attention.backend} rel err {rel_err(out, ref):.1e}")
    assert rel_err(out, ref) <= 1e-5, rel_err(out, ref)
