"""The decoder-LM floor on Gemma-3: every hidden state, the loader's folder kinds and config
generations, int8 storage, and Gemma's tokenizer, against transformers (torch, CPU)."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import gemma_reference as G  # noqa: E402
from ditax.errors import ConfigError, ModelNotFound, WeightError  # noqa: E402
from ditax.models.encoders.decoder_lm.config import FULL, SLIDING  # noqa: E402
from ditax.models.encoders.decoder_lm.gemma3 import gemma3_config, load_gemma3  # noqa: E402
from ditax.models.encoders.decoder_lm.model import hidden_states  # noqa: E402
from ditax.models.encoders.decoder_lm.tokenizer import load_gemma_tokenizer  # noqa: E402
from ditax.parallel.mesh import make_mesh  # noqa: E402

T = 24


@pytest.fixture(scope="module")
def tiny():
    return G.tiny_ltx2_text_folder()


@pytest.fixture(scope="module")
def batch(tiny):
    """Left-padded ids of the prompts (as the LTX-2 pipeline tokenizes them), and the same
    prompts right-padded."""
    _, _, ref_tok, _ = tiny
    enc = ref_tok([p.strip() for p in G.PROMPTS], padding="max_length", max_length=T,
                  truncation=True, return_tensors="np")
    left_ids, left_mask = enc["input_ids"], enc["attention_mask"]
    right_ids = np.zeros_like(left_ids)
    right_mask = np.zeros_like(left_mask)
    for i, (row, m) in enumerate(zip(left_ids, left_mask)):
        n = int(m.sum())
        right_ids[i, :n], right_mask[i, :n] = row[T - n:], 1
    return (left_ids, left_mask), (right_ids, right_mask)


@pytest.fixture(scope="module")
def float_out(tiny, batch):
    folder = tiny[0]
    enc = load_gemma3(folder)
    (ids, mask), _ = batch
    return enc, np.asarray(hidden_states(enc, jnp.asarray(ids), jnp.asarray(mask)))


def test_hidden_states_match_transformers(tiny, batch, float_out):
    _, model, _, _ = tiny
    enc, _ = float_out
    assert enc.cfg.layer_types == (SLIDING, FULL, SLIDING, FULL)
    assert enc.cfg.num_kv_heads < enc.cfg.num_heads                     # GQA
    for ids, mask in batch:                                              # left, then right pad
        assert mask.min() == 0 and mask.max() == 1
        ref = G.gemma_hidden_states(model, ids, mask)
        out = np.asarray(hidden_states(enc, jnp.asarray(ids), jnp.asarray(mask)))
        assert out.shape == ref.shape == (5, len(G.PROMPTS), T, G.TEXT["hidden_size"])
        # padded rows included (left pads: the zero rows of SDPA)
        errs = [G.rel_err(o, r) for o, r in zip(out, ref)]
        print("gemma3 hidden states rel err per layer", ["%.1e" % e for e in errs])
        assert max(errs) < 1e-5


def test_text_model_folders_and_old_configs(tiny, batch, float_out, tmp_path):
    """A Gemma3ForCausalLM folder (keys under ``model.``) loads the same numbers; a config of
    the earlier generation (rope_theta / rope_local_base_freq / rope_scaling /
    sliding_window_pattern, no layer_types) reads the same."""
    folder, model, _, _ = tiny
    enc, out = float_out
    text_cfg = model.config.text_config
    causal = transformers.Gemma3ForCausalLM(text_cfg)
    missing = causal.model.load_state_dict(model.model.language_model.state_dict())
    assert not missing.missing_keys
    causal.save_pretrained(tmp_path / "causal")
    keys = json.loads((tmp_path / "causal" / "config.json").read_text())
    assert keys["model_type"] == "gemma3_text"
    (ids, mask), _ = batch
    other = load_gemma3(tmp_path / "causal")
    np.testing.assert_array_equal(
        np.asarray(hidden_states(other, jnp.asarray(ids), jnp.asarray(mask))), out)

    old = {k: v for k, v in text_cfg.to_dict().items()
           if k not in ("layer_types", "rope_parameters")}
    old.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2,
               rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert gemma3_config({"model_type": "gemma3", "text_config": old}) == enc.cfg
    hub_12b = gemma3_config({"model_type": "gemma3", "text_config": {
        "hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
        "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}})
    assert hub_12b.layer_types[:6] == (SLIDING,) * 5 + (FULL,)
    assert (hub_12b.rope_full.theta, hub_12b.rope_full.factor) == (1e6, 8.0)
    assert hub_12b.rope_sliding.theta == 1e4 and hub_12b.scale == 256 ** -0.5


def test_int8_storage_close_to_float_and_shards(tiny, batch, float_out):
    folder = tiny[0]
    enc, out = float_out
    q = load_gemma3(folder, quantize="int8")
    kernel = q.layers.self_attn.q_proj.kernel[...]
    assert kernel.dtype == jnp.int8 and kernel.shape[0] == enc.cfg.num_layers
    assert q.embed_tokens[...].dtype == jnp.float32        # embeddings and norms stay float
    (ids, mask), _ = batch
    got = np.asarray(hidden_states(q, jnp.asarray(ids), jnp.asarray(mask)))
    valid = mask > 0
    errs = [G.rel_err(g[valid], o[valid]) for g, o in zip(got, out)]
    print("gemma3 int8 rel err per layer", ["%.1e" % e for e in errs])
    assert errs[0] == 0.0                                   # the embeddings are not quantized
    # per-channel int8 of 4 random layers: measured 0.4-0.9 %; 2 % leaves room for seeds
    assert max(errs) < 2e-2
    # read straight into shardings (fsdp 4 x tensor 2): the same numbers
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    qs = load_gemma3(folder, quantize="int8", mesh=mesh)
    kernel = qs.layers.mlp.gate_proj.kernel[...]
    assert tuple(kernel.sharding.spec) == (None, "fsdp", "tensor") and kernel.dtype == jnp.int8
    sharded = np.asarray(hidden_states(qs, jnp.asarray(ids), jnp.asarray(mask)))
    assert G.rel_err(sharded, got) < 1e-6


def test_tokenizer_matches_transformers(tiny, tmp_path):
    folder, _, ref_tok, _ = tiny
    prompts = [p.strip() for p in G.PROMPTS] + ["<start_of_turn>user hi<end_of_turn>"]
    tok = load_gemma_tokenizer(folder)
    assert tok.padding_side == "left" == ref_tok.padding_side and tok.pad_token == "<pad>"
    for side, n in (("left", T), ("right", 40)):
        ref_tok.padding_side = tok.padding_side = side
        want = ref_tok(prompts, padding="max_length", max_length=n, truncation=True,
                       return_tensors="np")
        ids, mask = tok.encode(prompts, n)
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(mask, want["attention_mask"])
    ref_tok.padding_side = "left"
    # a config that asks for the end token too (transformers 5 ignores that beside a
    # tokenizer.json) and names no pad token: the end token pads, as LTX2Pipeline does
    shutil.copytree(folder / "tokenizer", tmp_path / "tok")
    cfg_path = tmp_path / "tok" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(add_bos_token=True, add_eos_token=True, pad_token=None)
    cfg_path.write_text(json.dumps(cfg))
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert ref.pad_token is None
    ref.pad_token = ref.eos_token                 # what LTX2Pipeline does in this case
    ours = load_gemma_tokenizer(tmp_path / "tok")
    assert ours.pad_token == "<eos>"
    want = ref(prompts, padding="max_length", max_length=T, truncation=True,
               return_tensors="np")
    ids, mask = ours.encode(prompts, T)
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(mask, want["attention_mask"])
    assert (ids[:, -1] != ours.pad_id).all() and (ids[mask > 0] == ours.pad_id).sum() == 0


def test_bad_inputs_one_line(tiny, tmp_path):
    folder = tiny[0]
    for make, err, match in [
        (lambda: gemma3_config({"model_type": "llama"}), ConfigError, "not Gemma-3"),
        (lambda: gemma3_config({"model_type": "gemma3_text", "rope_scaling": {
            "rope_type": "yarn", "factor": 2.0}}), ConfigError, "'yarn' is not one of"),
        (lambda: gemma3_config({"model_type": "gemma3_text", "num_attention_heads": 6}),
         ConfigError, "not a multiple of num_key_value_heads=4"),
        (lambda: load_gemma3(folder, quantize="int4"), ConfigError, "int4"),
        (lambda: load_gemma_tokenizer(tmp_path), ModelNotFound, "tokenizer.json"),
    ]:
        with pytest.raises(err, match=match) as e:
            make()
        assert "\n" not in str(e.value)
    shutil.copytree(folder / "text_encoder", tmp_path / "te")
    cfg_path = tmp_path / "te" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["text_config"]["num_hidden_layers"] = 5
    cfg["text_config"]["layer_types"].append(FULL)
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(WeightError, match=r"missing \d+ key\(s\): language_model\.model\."
                                          r"layers\.4\.") as e:
        load_gemma3(tmp_path / "te")
    assert "\n" not in str(e.value)
