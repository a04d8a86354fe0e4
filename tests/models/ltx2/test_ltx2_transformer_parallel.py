"""LTX-2 on meshes: the video tokens over the context axis (18 tokens padded to 20 on 4
shards) with ``ulysses`` (local splash, interpreted: every attention site of both streams
runs it), ``ring`` (local blockwise) and ``ulysses_ring`` beside fsdp and tensor sharding,
each equal to diffusers (so to one device); one device with isolate_modalities and a text
mask that hides every key of a sample."""

import numpy as np
import pytest

import ditax
from ditax.config import AttentionConfig
from ditax.parallel import make_mesh
from ltx2_reference import PAR, ltx2_inputs, make_diffusers_ltx2, run_diffusers_ltx2
from wan_reference import rel_err


@pytest.fixture(scope="module")
def model(tmp_path_factory, fast_compile):
    return make_diffusers_ltx2(tmp_path_factory.mktemp("ltx2_par"), **PAR)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(11)
    x = ltx2_inputs(rng, PAR)
    return dict(x, sigma=rng.uniform(0, 1000, 2).astype(np.float32),
                video_keyframes_mask=(rng.uniform(size=(2, 18, 1)) > 0.5).astype(np.float32))


@pytest.fixture(scope="module")
def reference(model, inputs):
    return run_diffusers_ltx2(model[0], inputs)


def _check(out, ref):
    for o, r in zip(out, ref):
        assert o.shape == r.shape and rel_err(o, r) <= 1e-5, rel_err(o, r)


@pytest.mark.parametrize("mesh_kw,acfg", [
    ({"fsdp": 2, "context": 4}, AttentionConfig(backend="ulysses", local="splash")),
    ({"context": 4, "tensor": 2}, AttentionConfig(backend="ring", local="blockwise",
                                                  block_kv=8)),
    # the ring x Ulysses view of the context axis beside shard_maps over the mesh itself
    ({"fsdp": 2, "context": 4}, AttentionConfig(backend="ulysses_ring", local="xla",
                                                ulysses_shards=2)),
], ids=["ulysses-splash-fsdp2-context4", "ring-blockwise-context4-tensor2",
        "ulysses_ring-fsdp2-context4"])
def test_sequence_parallel_equals_diffusers(model, inputs, reference, mesh_kw, acfg):
    tr = ditax.load_transformer(model[1], mesh=make_mesh(mesh_kw), attention=acfg)
    k = tr.module.transformer_blocks.audio_to_video_attn.to_q.kernel[...]   # [layers, D, Da]
    shards = mesh_kw.get("fsdp", 1) * mesh_kw["context"]
    assert k.sharding.shard_shape(k.shape)[1:] == (k.shape[1] // shards,
                                                   k.shape[2] // mesh_kw.get("tensor", 1))
    _check(tr(**inputs), reference)


def test_isolated_modalities_and_a_fully_masked_text_on_one_device(model, inputs):
    """isolate_modalities equals diffusers; a sample whose text mask hides every key attends
    to all of them, as diffusers' constant −10000 bias does in exact arithmetic (its float32
    logits − 10000 keep only their high bits, ~1e-4 off: compared with the unmasked row)."""
    m, folder = model
    hidden = inputs["encoder_attention_mask"].copy()
    hidden[1] = 0
    call = dict(inputs, isolate_modalities=True)
    out = ditax.load_transformer(folder)(**dict(call, encoder_attention_mask=hidden))
    shown = inputs["encoder_attention_mask"].copy()
    shown[1] = 1
    _check(out, run_diffusers_ltx2(m, dict(call, encoder_attention_mask=shown)))
