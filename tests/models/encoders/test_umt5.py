"""UMT5 encoder, tokenizer and encode_prompt against transformers / diffusers' formula (torch, CPU)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ditax.errors import WeightError  # noqa: E402
from ditax.models.encoders.tokenizer import clean_prompt, load_tokenizer  # noqa: E402
from ditax.models.encoders.t5 import relative_position_buckets  # noqa: E402
from ditax.models.encoders.umt5 import UMT5Encoder, encode_prompt, load_text_encoder  # noqa: E402
from flax import nnx  # noqa: E402

TINY = dict(vocab_size=256, d_model=48, d_kv=12, d_ff=80, num_layers=2, num_heads=4,
            relative_attention_num_buckets=32, relative_attention_max_distance=128,
            feed_forward_proj="gated-gelu", dropout_rate=0.0)


def _save_tiny_encoder(tmp_path, seed=0, **over):
    torch.manual_seed(seed)
    cfg = transformers.UMT5Config(**{**TINY, **over})
    model = transformers.UMT5EncoderModel(cfg).eval()
    with torch.no_grad():  # the default init leaves the bias tables tiny; make them matter
        for blk in model.encoder.block:
            blk.layer[0].SelfAttention.relative_attention_bias.weight.normal_(0, 1.0)
        for n, p in model.named_parameters():
            if "layer_norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    folder = tmp_path / "text_encoder"
    model.save_pretrained(folder)
    return model, folder


@nnx.jit
def _run(enc, ids, mask):  # one compile per shape instead of op-by-op dispatch
    return enc(ids, mask)


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _ids_and_mask(rng, lengths, t, vocab):
    ids = rng.integers(1, vocab, size=(len(lengths), t)).astype(np.int64)
    mask = (np.arange(t)[None] < np.asarray(lengths)[:, None]).astype(np.int64)
    ids = np.where(mask > 0, ids, 0)
    return ids, mask


@pytest.mark.parametrize("ffp", ["gated-gelu", "relu"])
def test_umt5_matches_transformers(tmp_path, rng, ffp):
    model, folder = _save_tiny_encoder(tmp_path, feed_forward_proj=ffp)
    enc = load_text_encoder(tmp_path)  # pipeline-style folder: finds text_encoder/
    assert isinstance(enc, UMT5Encoder)
    t = 40  # > max_exact so both the exact and the log buckets are exercised
    ids, mask = _ids_and_mask(rng, [40, 17, 1], t, TINY["vocab_size"])
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), torch.from_numpy(mask)).last_hidden_state.numpy()
    out = np.asarray(_run(enc, jnp.asarray(ids, jnp.int32), jnp.asarray(mask)))
    assert out.shape == ref.shape and out.dtype == np.float32
    # padded query rows are meaningless but still defined; compare everything
    err = _rel(out, ref)
    print(f"umt5 {ffp} rel err {err:.2e}")
    assert err < 1e-5


def test_sharded_and_bf16_loading(tmp_path, rng):
    model, folder = _save_tiny_encoder(tmp_path)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    ids, mask = _ids_and_mask(rng, [9, 5], 9, TINY["vocab_size"])
    a = np.asarray(_run(load_text_encoder(folder), ids, mask))
    b = np.asarray(_run(load_text_encoder(sharded), ids, mask))
    np.testing.assert_array_equal(a, b)
    enc16 = load_text_encoder(folder, dtype="bfloat16")
    assert enc16.shared[...].dtype == jnp.bfloat16
    c = np.asarray(_run(enc16, ids, mask)).astype(np.float32)
    assert _rel(c, a) < 5e-2


def test_relative_buckets_match_reference():
    model = transformers.UMT5EncoderModel(transformers.UMT5Config(**TINY))
    attn = model.encoder.block[0].layer[0].SelfAttention
    rel = torch.arange(512)[None, :] - torch.arange(512)[:, None]
    ref = attn._relative_position_bucket(rel).numpy()
    ours = relative_position_buckets(512, 512, 32, 128)
    np.testing.assert_array_equal(ours, ref)


def test_load_errors_name_the_keys(tmp_path):
    _, folder = _save_tiny_encoder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_layers"] = 3
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightError, match=r"missing \d+ key\(s\): encoder\.block\.2"):
        load_text_encoder(folder)
    cfg["num_layers"] = 2
    cfg["d_ff"] = 64
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightError, match=r"DenseReluDense\.wi_0\.weight: shape \(80, 48\)"):
        load_text_encoder(folder)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_text_encoder(tmp_path / "nowhere")


# ----------------------------------------------------------------------------- tokenizer

SENTENCES = [
    "a cat walks on the grass in the sunshine",
    "a dog runs along the beach at sunset, waves crashing",
    "the camera pans slowly over a snowy mountain range",
    "two people dance in a neon lit street at night",
    "close up of a flower opening in time lapse",
    "ein Hund läuft am Strand entlang",
]


def _save_tiny_tokenizer(folder):
    """Train a tiny Unigram tokenizer with a T5-style '</s>' post-processor and save it as a
    transformers fast tokenizer folder (tokenizer.json + tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import Unigram

    tok = Tokenizer(Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(),
                                           normalizers.Replace(" {2,}", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>")
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("tokenizer_class", [None, "T5Tokenizer"])
def test_tokenizer_matches_transformers(tmp_path, tokenizer_class):
    folder = _save_tiny_tokenizer(tmp_path / "tokenizer")
    if tokenizer_class:  # Wan folders name T5Tokenizer; transformers then builds that class
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg.update(tokenizer_class=tokenizer_class, extra_ids=0)
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    ref_tok = transformers.AutoTokenizer.from_pretrained(folder)
    ours = load_tokenizer(tmp_path)  # pipeline-style folder: finds tokenizer/
    prompts = ["a cat walks", "a dog runs along the beach at sunset, waves crashing on rocks " * 3,
               "", "ein Hund zebra xylophone"]
    for max_length in (8, 24):
        ref = ref_tok(prompts, padding="max_length", max_length=max_length, truncation=True,
                      add_special_tokens=True, return_attention_mask=True, return_tensors="np")
        ids, mask = ours.encode(prompts, max_length)
        assert ids.dtype == np.int32 and ids.shape == (len(prompts), max_length)
        np.testing.assert_array_equal(ids, ref["input_ids"])
        np.testing.assert_array_equal(mask, ref["attention_mask"])
    # truncation keeps the end token, and short prompts are padded with the pad id
    assert ids[1, -1] == ref_tok.eos_token_id and ids[0, -1] == ref_tok.pad_token_id


def test_clean_prompt_matches_pipeline():
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    for s in ["  a &amp;amp; b\n\t c  ", "x&lt;y", "plain"]:
        assert clean_prompt(s) == prompt_clean(s)


def test_encode_prompt_zeroes_padding(tmp_path):
    """encode_prompt == the pipeline's formula (encoder output, then rows past each prompt's
    token count replaced by zeros), computed with transformers' tokenizer and encoder."""
    model, _ = _save_tiny_encoder(tmp_path, vocab_size=128)
    _save_tiny_tokenizer(tmp_path / "tokenizer")
    ref_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert len(ref_tok) <= 128
    enc = load_text_encoder(tmp_path)
    tok = load_tokenizer(tmp_path)
    prompts = ["a cat  walks on the grass", "two people dance in a neon lit street at night " * 4]
    max_length = 20
    got = np.asarray(encode_prompt(tok, enc, prompts, max_length))

    ti = ref_tok([clean_prompt(p) for p in prompts], padding="max_length", max_length=max_length,
                 truncation=True, add_special_tokens=True, return_attention_mask=True,
                 return_tensors="pt")
    with torch.no_grad():
        h = model(ti.input_ids, ti.attention_mask).last_hidden_state
    lens = ti.attention_mask.gt(0).sum(dim=1)
    want = torch.stack([torch.cat([u[:v], u.new_zeros(max_length - v, u.size(1))])
                        for u, v in zip(h, lens)]).numpy()
    assert got.shape == (2, max_length, TINY["d_model"])
    assert int(lens[0]) < max_length and np.all(got[0, int(lens[0]):] == 0)
    assert np.all(np.abs(got[:, : int(lens[0])]).sum(-1) > 0)
    err = _rel(got, want)
    print(f"encode_prompt rel err {err:.2e}")
    assert err < 1e-5
