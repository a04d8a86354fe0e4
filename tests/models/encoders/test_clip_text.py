"""CLIP text encoder (FLUX.1's text_encoder) against transformers' CLIPTextModel (torch, CPU)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from ditax.errors import ConfigError, RequestError, WeightError  # noqa: E402
from ditax.models.encoders.clip import (CLIPTextConfig, CLIPTextEncoder, encode_clip_pooled,  # noqa: E402
                               load_clip_text_encoder)

VOCAB = 99
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=21, layer_norm_eps=1e-5,
            bos_token_id=0, pad_token_id=1, projection_dim=16)


def _save_tiny(folder, seed=0, **over):
    torch.manual_seed(seed)
    model = transformers.CLIPTextModel(transformers.CLIPTextConfig(**{**TINY, **over})).eval()
    with torch.no_grad():  # the default init leaves norms at 1/0 and embeddings tiny
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_((1.0 if n.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            elif "embedding" in n:
                p.copy_(torch.randn_like(p))
    model.save_pretrained(folder)
    return model


@nnx.jit
def _run(enc, ids, mask=None):  # eager scans recompile on every call: jit once per shape
    return enc(ids, mask)


class _Tok:
    """Stands in for the tokenizer: fixed ids, as if padded to its max length."""
    model_max_length = 7

    def __init__(self, ids):
        self.ids = ids

    def encode(self, prompts, max_length):
        assert len(prompts) == len(self.ids) and max_length == self.ids.shape[1]
        return self.ids, None


def _pooled(enc, ids):
    """FluxPipeline's CLIP formula: padded ids, no mask, pooler_output."""
    return np.asarray(encode_clip_pooled(_Tok(ids), enc, ["a prompt"] * len(ids)))


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _ids(rng, lengths, t, eos, pad):
    """Rows of random word ids ending in ``eos`` at ``lengths[i] - 1``, padded with ``pad``."""
    ids = rng.integers(2, VOCAB - 2, size=(len(lengths), t))
    ids = np.where(ids == eos, eos + 1, ids)  # no stray end token before the real one
    for i, n in enumerate(lengths):
        ids[i, n - 1], ids[i, n:] = eos, pad
    return ids


# the old rule (eos_token_id == 2): the pooled state is at the largest id, the end token being
# the vocabulary's last; the new rule: at the first eos_token_id (here one of the word ids,
# padded with itself as FLUX's tokenizer pads with its end token)
@pytest.mark.parametrize("eos_token_id,eos,act", [(2, VOCAB - 1, "quick_gelu"), (7, 7, "gelu")])
def test_clip_text_matches_transformers(tmp_path, rng, eos_token_id, eos, act):
    model = _save_tiny(tmp_path / "text_encoder", eos_token_id=eos_token_id, hidden_act=act)
    enc = load_clip_text_encoder(tmp_path)  # pipeline-style folder: finds text_encoder/
    assert isinstance(enc, CLIPTextEncoder) and enc.cfg.eos_token_id == eos_token_id
    t = 19
    ids = _ids(rng, [19, 11, 2], t, eos, pad=eos)
    want = np.array([18, 10, 1])
    mask = (np.arange(t)[None] < np.array([[19], [11], [2]])).astype(np.int64)
    for m in (None, mask) if eos_token_id == 2 else (None,):  # the mask: one case is enough
        with torch.no_grad():
            ref = model(torch.from_numpy(ids), None if m is None else torch.from_numpy(m))
        hidden, pooled = _run(enc, jnp.asarray(ids, jnp.int32),
                              None if m is None else jnp.asarray(m, jnp.int32))
        hidden, pooled = np.asarray(hidden), np.asarray(pooled)
        eh = _rel(hidden, ref.last_hidden_state.numpy())
        ep = _rel(pooled, ref.pooler_output.numpy())
        print(f"clip text eos_token_id={eos_token_id} mask={m is not None}: last hidden "
              f"{eh:.2e}, pooled {ep:.2e}")
        assert hidden.shape == (3, t, 32) and pooled.shape == (3, 32)
        assert eh < 1e-5 and ep < 1e-5
    np.testing.assert_array_equal(pooled, hidden[np.arange(3), want])  # pooled at the eos


def test_prefixed_keys_sharded_bf16(tmp_path, rng):
    """transformers 4 names the tower text_model.*; sharded folders; bfloat16 storage; the
    pooled vector through encode_clip_pooled (FluxPipeline's formula) equals transformers'."""
    model = _save_tiny(tmp_path / "plain")
    folder = tmp_path / "prefixed"
    folder.mkdir()
    (folder / "config.json").write_text((tmp_path / "plain" / "config.json").read_text())
    weights = load_file(tmp_path / "plain" / "model.safetensors")
    assert not any(k.startswith("text_model.") for k in weights)
    save_file({("text_model." + k if not k.startswith("text_model.") else k): v
               for k, v in weights.items()}
              | {"text_model.embeddings.position_ids": np.arange(21)[None],
                 "text_projection.weight": np.zeros((16, 32), np.float32)},
              folder / "model.safetensors")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ids = _ids(rng, [7, 4], 7, 2, 2)
    a = _pooled(load_clip_text_encoder(tmp_path / "plain"), ids)
    with torch.no_grad():
        assert _rel(a, model(torch.from_numpy(ids)).pooler_output.numpy()) < 1e-5
    np.testing.assert_array_equal(a, _pooled(load_clip_text_encoder(folder), ids))
    np.testing.assert_array_equal(a, _pooled(load_clip_text_encoder(tmp_path / "sharded"), ids))
    enc16 = load_clip_text_encoder(folder, dtype="bfloat16")
    assert enc16.embeddings.token_embedding[...].dtype == jnp.bfloat16
    assert _rel(_pooled(enc16, ids).astype(np.float32), a) < 5e-2


def test_checks(tmp_path):
    folder = tmp_path / "te"
    _save_tiny(folder)
    cfg = json.loads((folder / "config.json").read_text())
    for key, value, err, match in [
            ("num_hidden_layers", 3, WeightError, r"missing \d+ key\(s\): .*layers\.2\."),
            ("vocab_size", 100, WeightError, r"token_embedding\.weight: shape \(99, 32\)"),
            ("eos_token_id", [2, 3], ConfigError, r"eos_token_id=\[2, 3\].*single int"),
            ("hidden_act", "gelu_fast", ConfigError, r"hidden_act='gelu_fast'")]:
        (folder / "config.json").write_text(json.dumps({**cfg, key: value}))
        with pytest.raises(err, match=match):
            load_clip_text_encoder(folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RequestError, match="22 text tokens, more than max_position_embeddings=21"):
        _run(load_clip_text_encoder(folder), jnp.ones((1, 22), jnp.int32))
    # transformers' default end id where config.json names none; the preset is FLUX.1's
    assert CLIPTextConfig.from_hf({k: v for k, v in cfg.items()
                                   if k != "eos_token_id"}).eos_token_id == 49407
    c = CLIPTextConfig()
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
            c.max_position_embeddings, c.hidden_act, c.eos_token_id) == (
                49408, 768, 12, 12, 77, "quick_gelu", 2)
