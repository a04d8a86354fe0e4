"""FLUX.2's text encoders on the decoder-LM floor: Qwen3 (klein) and Mistral Small 3.1's text
model (dev) hidden states, their tokenizers and chat templates, the pipelines' prompt
embeddings and int8 storage, against transformers / diffusers (torch, CPU)."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("diffusers")

import decoder_lm_flux2_reference as R  # noqa: E402
from ditax.errors import ConfigError, ModelNotFound, RequestError  # noqa: E402
from ditax.models.encoders.decoder_lm import flux2_text as F  # noqa: E402
from ditax.models.encoders.decoder_lm.chat_tokenizer import (  # noqa: E402
    load_mistral_tokenizer, load_qwen3_tokenizer)
from ditax.models.encoders.decoder_lm.mistral import (  # noqa: E402
    load_mistral3_text, mistral_config)
from ditax.models.encoders.decoder_lm.model import hidden_states  # noqa: E402
from ditax.models.encoders.decoder_lm.qwen3 import load_qwen3, qwen3_config  # noqa: E402

KLEIN_T, DEV_T = 40, 128       # max_sequence_length: some prompts padded, the longest cut


@pytest.fixture(scope="module")
def tiny():
    return R.tiny_flux2_text_folders()


@pytest.fixture(scope="module")
def klein(tiny):
    """(folder, torch model, transformers tokenizer, our model, our tokenizer, ids, mask)."""
    folder, model, ref_tok = tiny["klein"]
    tok = load_qwen3_tokenizer(folder)
    ids, mask = F.qwen3_prompt_ids(tok, R.PROMPTS, KLEIN_T)
    return folder, model, ref_tok, load_qwen3(folder), tok, ids, mask


@pytest.fixture(scope="module")
def dev(tiny):
    folder, model, ref_tok = tiny["dev"]
    tok = load_mistral_tokenizer(folder)
    ids, mask = F.mistral3_prompt_ids(tok, R.PROMPTS, DEV_T)
    return folder, model, ref_tok, load_mistral3_text(folder), tok, ids, mask


def _hidden(enc, ids, mask):
    return np.asarray(hidden_states(enc, jnp.asarray(ids), jnp.asarray(mask)))


def test_chat_template_ids_match_transformers(klein, dev, tmp_path_factory):
    """The pipelines' calls: klein renders each prompt alone (generation prompt, thinking
    off) and tokenizes it; dev renders system + prompt through the processor's path."""
    _, _, qref, _, qtok, ids, mask = klein
    convs = F.qwen3_conversations(R.PROMPTS)
    want_text = [qref.apply_chat_template(c, tokenize=False, add_generation_prompt=True,
                                          enable_thinking=False) for c in convs]
    assert qtok.apply_chat_template(convs, add_generation_prompt=True,
                                    enable_thinking=False) == want_text
    assert want_text[0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    want = qref(want_text, padding="max_length", truncation=True, max_length=KLEIN_T,
                return_tensors="np")
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(mask, want["attention_mask"])
    assert qtok.padding_side == "right" and mask[:, -1].min() == 0 and mask[:, -1].max() == 1
    # a longer chat: system turn, an assistant turn with reasoning, thinking on
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nhello"},
            {"role": "user", "content": "a cat?"}]
    assert qtok.apply_chat_template([chat], add_generation_prompt=True) == [
        qref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)]

    _, _, mref, _, mtok, ids, mask = dev
    convs = F.mistral3_conversations(R.PROMPTS)
    want = mref.apply_chat_template(convs, add_generation_prompt=False, tokenize=True,
                                    return_dict=True, return_tensors="np",
                                    padding="max_length", truncation=True, max_length=DEV_T)
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(mask, want["attention_mask"])
    assert mtok.padding_side == "left" and mask[:, 0].min() == 0 and mask[:, 0].max() == 1
    assert (ids == mtok.backend.token_to_id("<s>")).sum(axis=1).max() == 1   # one <s>, not two
    assert "[IMG]" not in mtok.apply_chat_template(convs)[2]
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    assert F.SYSTEM_MESSAGE == SYSTEM_MESSAGE
    # plain prompts with the post-processor's <s>; a config naming add_bos_token /
    # add_eos_token changes nothing beside a tokenizer.json, in transformers 5 as here
    tmp = tmp_path_factory.mktemp("tok") / "tok"
    shutil.copytree(dev[0] / "tokenizer", tmp)
    cfg = json.loads((tmp / "tokenizer_config.json").read_text())
    cfg.update(add_bos_token=False, add_eos_token=True, padding_side="right")
    (tmp / "tokenizer_config.json").write_text(json.dumps(cfg))
    for folder in (dev[0], tmp):
        ref = transformers.AutoTokenizer.from_pretrained(folder / "tokenizer" if folder == dev[0]
                                                         else folder)
        want = ref(R.PROMPTS, padding="max_length", truncation=True, max_length=KLEIN_T,
                   return_tensors="np")
        ids, mask = load_mistral_tokenizer(folder).encode(R.PROMPTS, KLEIN_T)
        np.testing.assert_array_equal(ids, want["input_ids"])
        np.testing.assert_array_equal(mask, want["attention_mask"])


def test_qwen3_hidden_states_match_transformers(klein):
    _, model, _, enc, _, ids, mask = klein
    cfg = enc.cfg
    assert cfg.qk_norm and cfg.num_kv_heads < cfg.num_heads and cfg.rope_full.theta == 1e6
    ref = R.hidden_states(model, ids, mask)
    out = _hidden(enc, ids, mask)
    assert out.shape == ref.shape == (5, len(R.PROMPTS), KLEIN_T, R.TEXT["hidden_size"])
    errs = [R.rel_err(o, r) for o, r in zip(out, ref)]
    print("qwen3 hidden states rel err per layer", ["%.1e" % e for e in errs])
    assert max(errs) < 1e-5


def test_mistral3_hidden_states_match_transformers(dev, tmp_path):
    """Left padding (the dev tokenizer's side here), head_dim != hidden/heads, and the three
    ways the text stack's keys are written: Mistral3ForConditionalGeneration saved
    (``language_model.model.``), its in-memory names (``model.language_model.``), and a
    MistralForCausalLM (``model.``)."""
    folder, model, _, enc, _, ids, mask = dev
    cfg = enc.cfg
    assert cfg.head_dim * cfg.num_heads != cfg.hidden_size and not cfg.qk_norm
    assert cfg.rope_full.theta == 1e9 and cfg.sliding_window is None
    ref = R.hidden_states(model, ids, mask)
    out = _hidden(enc, ids, mask)
    errs = [R.rel_err(o, r) for o, r in zip(out, ref)]
    print("mistral3 hidden states rel err per layer", ["%.1e" % e for e in errs])
    assert max(errs) < 1e-5

    from safetensors.torch import save_file

    memory = tmp_path / "memory"
    shutil.copytree(folder / "text_encoder", memory)
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    assert any(k.startswith("model.language_model.") for k in state)
    (memory / "model.safetensors").unlink()
    save_file(state, memory / "model.safetensors")
    causal = transformers.MistralForCausalLM(model.config.text_config)
    causal.model.load_state_dict(model.model.language_model.state_dict())
    causal.save_pretrained(tmp_path / "causal")
    for other in (memory, tmp_path / "causal"):
        np.testing.assert_array_equal(_hidden(load_mistral3_text(other), ids, mask), out)


def test_prompt_embeds_match_diffusers(klein, dev):
    """diffusers' own methods on the torch models and transformers tokenizers, at layers the
    tiny models have (the real pipelines read (9, 18, 27) / (10, 20, 30))."""
    from diffusers import Flux2KleinPipeline, Flux2Pipeline

    _, model, ref_tok, enc, tok, _, _ = klein
    with torch.no_grad():
        want = Flux2KleinPipeline._get_qwen3_prompt_embeds(
            model, ref_tok, R.PROMPTS, max_sequence_length=KLEIN_T,
            hidden_states_layers=(1, 3, 4)).numpy()
    got = np.asarray(F.qwen3_prompt_embeds(enc, tok, R.PROMPTS, KLEIN_T, (1, 3, 4)))
    assert got.shape == want.shape == (len(R.PROMPTS), KLEIN_T, 3 * R.TEXT["hidden_size"])
    err = R.rel_err(got, want)
    print("klein prompt_embeds rel err %.1e" % err)
    assert err < 1e-5

    _, model, ref_tok, enc, tok, _, _ = dev
    with torch.no_grad():
        want = Flux2Pipeline._get_mistral_3_small_prompt_embeds(
            model, ref_tok, R.PROMPTS, max_sequence_length=DEV_T,
            hidden_states_layers=(2, 1, 4)).numpy()
    got = np.asarray(F.mistral3_prompt_embeds(enc, tok, R.PROMPTS, DEV_T, (2, 1, 4)))
    err = R.rel_err(got, want)
    print("dev prompt_embeds rel err %.1e" % err)
    assert got.shape == want.shape and err < 1e-5


def test_8bit_close_to_float(klein, dev):
    for name, (folder, _, _, enc, _, ids, mask), load, mode, bound in (
            ("qwen3", klein, load_qwen3, "int8", 3e-2),
            ("mistral3", dev, load_mistral3_text, "int8", 3e-2),
            ("mistral3", dev, load_mistral3_text, "fp8", 0.15)):
        q = load(folder, quantize=mode)
        assert q.layers.mlp.up_proj.kernel[...].dtype == (
            jnp.int8 if mode == "int8" else jnp.float8_e4m3fn)
        assert q.embed_tokens[...].dtype == jnp.float32
        valid = mask > 0
        errs = [R.rel_err(g[valid], o[valid])
                for g, o in zip(_hidden(q, ids, mask), _hidden(enc, ids, mask))]
        print(name, mode, "rel err per layer", ["%.1e" % e for e in errs])
        assert errs[0] == 0.0                       # the embeddings are not quantized
        # per-channel 8 bits on 4 random 32-wide layers, growing with depth: int8 measured
        # 1.0 / 1.4 / 1.8 / 2.0 % (Qwen3) and 0.9 / 1.4 / 1.7 / 2.1 % (Mistral); fp8 (e4m3,
        # 3 mantissa bits) 4.5 / 6.6 / 7.6 / 8.9 %. The bounds leave room for seeds.
        assert max(errs) < bound


def test_hub_configs():
    """The configs the FLUX.2 checkpoints ship (written by transformers 4.5x: rope_theta, no
    rope_parameters; klein's Qwen3 with rope_scaling null; dev's Mistral Small 3.1 text_config
    without a model_type default for head_dim) read as the models are: 3 × hidden_size is the
    FLUX.2 transformers' joint_attention_dim (7680 klein 4B, 12288 klein 9B, 15360 dev)."""
    from ditax.models.encoders.decoder_lm.config import FULL, SLIDING

    qwen3_4b = qwen3_config({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2560,
        "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000, "rope_scaling": None,
        "max_window_layers": 36, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": True, "vocab_size": 151936, "rms_norm_eps": 1e-06})
    assert qwen3_4b.layer_types == (FULL,) * 36 and qwen3_4b.rope_full.theta == 1e6
    assert 3 * qwen3_4b.hidden_size == 7680 and qwen3_4b.qk_norm
    qwen3_8b = qwen3_config({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size":
                             12288, "num_hidden_layers": 36, "num_key_value_heads": 8,
                             "rope_theta": 1000000})
    assert 3 * qwen3_8b.hidden_size == 12288 and qwen3_8b.num_heads == 32
    dev = mistral_config({"architectures": ["Mistral3ForConditionalGeneration"],
                          "model_type": "mistral3", "text_config": {
                              "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
                              "intermediate_size": 32768, "max_position_embeddings": 131072,
                              "model_type": "mistral", "num_attention_heads": 32,
                              "num_hidden_layers": 40, "num_key_value_heads": 8,
                              "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
                              "sliding_window": None, "vocab_size": 131072},
                          "vision_config": {"model_type": "pixtral"}})
    assert dev.layer_types == (FULL,) * 40 and dev.sliding_window is None
    assert (dev.head_dim, dev.num_kv_heads, dev.rope_full.theta) == (128, 8, 1e9)
    assert 3 * dev.hidden_size == 15360 and not dev.qk_norm
    assert mistral_config({"model_type": "mistral3"}) == dev      # Mistral3Config's default
    # a plain Mistral with a sliding window: every layer slides; head_dim = hidden / heads
    plain = mistral_config({"model_type": "mistral", "sliding_window": 4096})
    assert plain.layer_types == (SLIDING,) * 32 and plain.head_dim == 128


def test_bad_inputs_one_line(klein, dev, tmp_path):
    qfolder, qenc, qtok = klein[0], klein[3], klein[4]
    raw = json.loads((qfolder / "text_encoder" / "config.json").read_text())
    mraw = json.loads((dev[0] / "text_encoder" / "config.json").read_text())
    cases = [
        (lambda: qwen3_config({**raw, "model_type": "llama"}), ConfigError, "not 'qwen3'"),
        (lambda: qwen3_config({**raw, "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                         "rope_theta": 1e6}}),
         ConfigError, "rope_type='yarn' is not supported"),
        (lambda: qwen3_config({**raw, "num_attention_heads": 3}), ConfigError,
         "not a multiple of num_key_value_heads=2"),
        (lambda: qwen3_config({**raw, "head_dim": 15}), ConfigError, "head_dim=15"),
        (lambda: mistral_config({**mraw, "text_config": {
            **mraw["text_config"], "rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                                       "rope_theta": 5e5}}}),
         ConfigError, "rope_type='llama3' is not supported"),
        (lambda: mistral_config({"model_type": "gemma3"}), ConfigError, "not Mistral"),
        (lambda: load_qwen3(qfolder, quantize="int4"), ConfigError, "int4"),
        (lambda: load_mistral_tokenizer(tmp_path), ModelNotFound, "tokenizer.json"),
        (lambda: F.qwen3_prompt_embeds(qenc, qtok, ["a"], 8, (9, 18, 27)), RequestError,
         r"has hidden states 0\.\.4 .*e\.g\. text_encoder_out_layers=\(1, 2, 3\)"),
        (lambda: dev[4].apply_chat_template([[{"role": "tool", "content": "x"}]]),
         RequestError, "Only user, system and assistant roles"),
    ]
    for make, err, match in cases:
        with pytest.raises(err, match=match) as e:
            make()
        assert "\n" not in str(e.value)
