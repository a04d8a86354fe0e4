"""T5 v1.1 encoder (FLUX.1's text_encoder_2) against transformers' T5EncoderModel (torch, CPU).

encode_t5_prompt (FluxPipeline's formula) is compared with diffusers in test_text_tokenizers.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402

from ditax.errors import ConfigError, WeightError  # noqa: E402
from ditax.models.encoders.t5 import T5Config, T5Encoder, load_t5_encoder, weight_table  # noqa: E402
from ditax.models.encoders.umt5 import load_text_encoder  # noqa: E402

# t5-v1_1 style: gated-gelu, no biases, one relative bias table (layer 0) shared by all layers
TINY = dict(vocab_size=160, d_model=40, d_kv=8, d_ff=72, num_layers=3, num_heads=6,
            relative_attention_num_buckets=32, relative_attention_max_distance=128,
            feed_forward_proj="gated-gelu", dropout_rate=0.0, tie_word_embeddings=False)


def _save_tiny(folder, seed=0, **over):
    torch.manual_seed(seed)
    model = transformers.T5EncoderModel(transformers.T5Config(**{**TINY, **over})).eval()
    with torch.no_grad():  # the default init leaves the bias table and norms trivial
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(0, 1)
        for n, p in model.named_parameters():
            if "layer_norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


@nnx.jit
def _run(enc, ids, mask=None):  # one compile per shape instead of op-by-op dispatch
    return enc(ids, mask)


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_t5_matches_transformers(tmp_path, rng):
    """Padded batch at an odd length past max_exact (exact and log buckets), with and without
    the mask; the pipeline-style folder is found through text_encoder_2/."""
    model = _save_tiny(tmp_path / "text_encoder_2")
    enc = load_t5_encoder(tmp_path)
    assert isinstance(enc, T5Encoder) and not enc.cfg.per_layer_bias
    assert enc.blocks[0].attn.has_bias and not enc.blocks[1].attn.has_bias
    t = 37
    ids = rng.integers(1, TINY["vocab_size"], size=(3, t))
    mask = (np.arange(t)[None] < np.array([[37], [20], [1]])).astype(np.int64)
    ids = np.where(mask > 0, ids, 0)
    outs = []
    for m in (mask, None):
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), None if m is None else torch.from_numpy(m))
        ref = ref.last_hidden_state.numpy()
        out = np.asarray(_run(enc, jnp.asarray(ids, jnp.int32),
                              None if m is None else jnp.asarray(m, jnp.int32)))
        err = _rel(out, ref)
        print(f"t5 mask={m is not None} rel err {err:.2e}")
        assert out.shape == ref.shape == (3, t, TINY["d_model"]) and err < 1e-5
        outs.append(out)
    assert np.abs(outs[0][1:] - outs[1][1:]).max() > 1e-3  # the mask changes padded rows' keys


def test_sharded_and_bf16_loading(tmp_path, rng):
    model = _save_tiny(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="30KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ids = jnp.asarray(rng.integers(0, TINY["vocab_size"], size=(2, 9)), jnp.int32)
    a = np.asarray(_run(load_t5_encoder(tmp_path / "one"), ids))
    np.testing.assert_array_equal(a, np.asarray(_run(load_t5_encoder(tmp_path / "sharded"), ids)))
    enc16 = load_t5_encoder(tmp_path / "one", dtype="bfloat16")
    assert enc16.shared[...].dtype == jnp.bfloat16
    assert _rel(np.asarray(_run(enc16, ids)).astype(np.float32), a) < 5e-2


def test_load_checks(tmp_path):
    """Strict keys / shapes, and a T5 folder given to the UMT5 loader (or the reverse) is
    refused naming the right loader."""
    folder = tmp_path / "te"
    _save_tiny(folder)
    cfg = json.loads((folder / "config.json").read_text())
    with pytest.raises(ConfigError, match=r"model_type='t5'.*ditax\.models\.encoders\.t5\.load_t5_encoder"):
        load_text_encoder(folder)
    for key, value, match in [
            ("num_layers", 4, r"missing \d+ key\(s\): encoder\.block\.3\."),
            ("d_ff", 64, r"DenseReluDense\.wi_0\.weight: shape \(72, 40\)"),
            ("model_type", "umt5", r"umt5.*ditax\.models\.encoders\.umt5\.load_text_encoder"),
            ("feed_forward_proj", "gated-foo", r"activation 'foo'")]:
        (folder / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises((WeightError, ConfigError), match=match):
            load_t5_encoder(folder)


def test_xxl_preset_and_table():
    """The defaults are google/t5-v1_1-xxl; its table reads one bias table (layer 0)."""
    cfg = T5Config()
    assert (cfg.d_model, cfg.d_kv, cfg.d_ff, cfg.num_layers, cfg.num_heads, cfg.vocab_size,
            cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
            cfg.act_name) == (4096, 64, 10240, 24, 64, 32128, 32, 128, "gelu_new")
    keys = weight_table(cfg).expected_keys()
    assert sum("relative_attention_bias" in k for k in keys) == 1
    assert len(keys) == 2 + 24 * 9 + 1
