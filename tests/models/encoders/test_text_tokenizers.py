"""FLUX.1's tokenizers (CLIPTokenizer from vocab.json + merges.txt, T5TokenizerFast from
tokenizer.json) against transformers loading the same files."""

import base64
import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from ditax.errors import ModelNotFound  # noqa: E402
from ditax.models.encoders.tokenizer import load_clip_tokenizer, load_t5_tokenizer  # noqa: E402

CORPUS = ["a cat walks on the grass in the sunshine", "A DOG runs along the beach, at sunset!",
          "café naïve crème brûlée in Köln", "it's 2024 and we're here: 3 red circles",
          "the camera pans slowly over a snowy mountain range", "東京 タワー at night"]

PROMPTS = ["a cat walks", "", "  A   Dog\truns\nalong  ", "Café NAÏVE ﬁne Ｆｕｌｌ 東京 😀 x",
           "it's a cat's toy <|endoftext|> and 42 dogs",
           "two people dance in a neon lit street at night, " * 12]   # past any max length


def _compare(ours, ref, max_length):
    want = ref(PROMPTS, padding="max_length", max_length=max_length, truncation=True,
               return_attention_mask=True, return_tensors="np")
    ids, mask = ours.encode(PROMPTS, max_length)
    assert ids.shape == (len(PROMPTS), max_length) and ids.dtype == np.int32
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(mask, want["attention_mask"])
    return ids


# ----------------------------------------------------------------------------- CLIP

def _write_clip_folder(folder):
    """A tiny byte-level BPE trained with CLIP's normalizer and pre-tokenizer, written as
    FLUX.1's tokenizer/ is: vocab.json (special tokens last, as CLIP's), merges.txt,
    tokenizer_config.json + special_tokens_map.json, no tokenizer.json."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(end_of_word_suffix="</w>", continuing_subword_prefix=""))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"), behavior="removed",
                             invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.train_from_iterator(CORPUS * 4, trainer=trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        end_of_word_suffix="</w>"))
    model = json.loads(tok.to_str())["model"]
    words = sorted(model["vocab"], key=model["vocab"].get)
    vocab = {w: i for i, w in enumerate(words + ["<|startoftext|>", "<|endoftext|>"])}
    folder.mkdir(parents=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(
        f"{a} {b}\n" for a, b in model["merges"]), encoding="utf-8")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
               "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special))
    added = {str(vocab[t]): {"content": t, "lstrip": False, "normalized": True, "rstrip": False,
                             "single_word": False, "special": True}
             for t in ("<|startoftext|>", "<|endoftext|>")}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**special, "model_max_length": 77, "tokenizer_class": "CLIPTokenizer",
         "do_lower_case": True, "errors": "replace", "added_tokens_decoder": added}))
    return vocab


def test_clip_tokenizer_matches_transformers(tmp_path):
    vocab = _write_clip_folder(tmp_path / "tokenizer")
    ours = load_clip_tokenizer(tmp_path)   # pipeline-style folder: finds tokenizer/
    ref = transformers.CLIPTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert ours.model_max_length == ref.model_max_length == 77
    assert ours.pad_id == ref.pad_token_id == vocab["<|endoftext|>"]
    ids = _compare(ours, ref, 77)
    _compare(ours, ref, 9)                 # truncation keeps both special tokens
    bos, eos = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    assert list(ids[1, :3]) == [bos, eos, eos] and ids[-1, 0] == bos and ids[-1, -1] == eos
    # a folder with the tokenizer.json transformers writes is read from that file as saved
    ref.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "tokenizer.json").is_file()
    _compare(load_clip_tokenizer(tmp_path / "saved"), ref, 77)


# ----------------------------------------------------------------------------- T5

def _unigram_vocab():
    """A small Unigram (T5's layout: <pad> 0, </s> 1, <unk> 2) as (piece, score) pairs."""
    from tokenizers import Tokenizer, pre_tokenizers, trainers
    from tokenizers.models import Unigram

    tok = Tokenizer(Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(CORPUS * 4, trainer=trainers.UnigramTrainer(
        vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    return [tuple(p) for p in json.loads(tok.to_str())["model"]["vocab"]]


def _spm_model(folder):
    """A tiny SentencePiece model (nmt_nfkc normalisation, as T5's spiece.model)."""
    spm = pytest.importorskip("sentencepiece")
    (folder / "corpus.txt").write_text("\n".join(CORPUS * 4), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "spiece"), vocab_size=64,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        character_coverage=1.0, minloglevel=2)
    return folder / "spiece.model"


def _as_older_converter(folder, spm_model):
    """Rewrite ``folder/tokenizer.json`` as transformers 4's T5 converter wrote it (FLUX.1's
    tokenizer_2/): SentencePiece's precompiled normaliser + a ``Replace`` of space runs,
    Metaspace alone as the pre-tokenizer."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(spm_model.read_bytes())
    charsmap = base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode()
    assert charsmap
    raw = json.loads((folder / "tokenizer.json").read_text())
    raw["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Precompiled", "precompiled_charsmap": charsmap},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
    raw["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                            "prepend_scheme": "always", "split": True}
    (folder / "tokenizer.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("source", ["unigram", "older_converter"])
def test_t5_tokenizer_matches_transformers(tmp_path, source):
    """FLUX.1's tokenizer_2/: a T5TokenizerFast saved by transformers from a Unigram
    vocabulary, or a SentencePiece model's file as transformers 4 converted it (with its
    nmt_nfkc normaliser, which folds the ligature and full-width letters of PROMPTS)."""
    if source == "unigram":
        made = transformers.T5TokenizerFast(vocab=_unigram_vocab(), extra_ids=3)
    else:
        spm_model = _spm_model(tmp_path)
        made = transformers.T5TokenizerFast(vocab_file=str(spm_model), extra_ids=3)
    made.model_max_length = 512
    made.save_pretrained(tmp_path / "tokenizer_2")
    if source != "unigram":
        _as_older_converter(tmp_path / "tokenizer_2", spm_model)
    ref = transformers.T5TokenizerFast.from_pretrained(tmp_path / "tokenizer_2")
    ours = load_t5_tokenizer(tmp_path)     # pipeline-style folder: finds tokenizer_2/
    assert ours.pad_id == ref.pad_token_id == 0 and ours.model_max_length == 512
    ids = _compare(ours, ref, 24)
    _compare(ours, ref, 512)
    assert list(ids[1, :2]) == [ref.eos_token_id, 0] and ids[-1, -1] == ref.eos_token_id
    if source != "unigram":  # the normaliser ran: "ﬁne Ｆｕｌｌ" is "fine Full"
        assert ref.tokenize("ﬁne Ｆｕｌｌ") == ref.tokenize("fine Full")


def test_t5_sentencepiece_only_folder_is_named(tmp_path):
    folder = tmp_path / "tokenizer_2"
    folder.mkdir()
    (folder / "spiece.model").write_bytes(b"\0")
    with pytest.raises(ModelNotFound, match=r"spiece\.model but no tokenizer\.json.*save_pretrained"):
        load_t5_tokenizer(tmp_path)


# ----------------------------------------------------------------------------- FLUX.1's formulas

def test_flux_prompt_encoders_match_diffusers(tmp_path):
    """load_clip_text / load_t5 on a pipeline folder, then encode_clip_pooled /
    encode_t5_prompt == FluxPipeline._get_clip_prompt_embeds / _get_t5_prompt_embeds with
    transformers' tokenizers and encoders on the same folder (float32)."""
    import types

    torch = pytest.importorskip("torch")
    flux = pytest.importorskip("diffusers.pipelines.flux.pipeline_flux")

    from ditax.models.encoders.clip import encode_clip_pooled, load_clip_text
    from ditax.models.encoders.t5 import encode_t5_prompt, load_t5

    vocab = _write_clip_folder(tmp_path / "tokenizer")
    transformers.T5TokenizerFast(vocab=_unigram_vocab(), extra_ids=3).save_pretrained(
        tmp_path / "tokenizer_2")
    torch.manual_seed(0)
    clip = transformers.CLIPTextModel(transformers.CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, eos_token_id=2)).eval()
    ref = types.SimpleNamespace(
        tokenizer=transformers.CLIPTokenizer.from_pretrained(tmp_path / "tokenizer"),
        tokenizer_2=transformers.T5TokenizerFast.from_pretrained(tmp_path / "tokenizer_2"),
        text_encoder=clip, tokenizer_max_length=77)
    ref.text_encoder_2 = transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=len(ref.tokenizer_2), d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu", dropout_rate=0.0)).eval()
    clip.save_pretrained(tmp_path / "text_encoder")
    ref.text_encoder_2.save_pretrained(tmp_path / "text_encoder_2")

    clip_enc, clip_tok = load_clip_text(tmp_path)
    t5_enc, t5_tok = load_t5(tmp_path)
    prompts = PROMPTS[:4] + PROMPTS[5:]
    cpu = torch.device("cpu")
    with torch.no_grad():
        want_pooled = flux.FluxPipeline._get_clip_prompt_embeds(ref, prompts, device=cpu)
        want_t5 = flux.FluxPipeline._get_t5_prompt_embeds(ref, prompts, max_sequence_length=40,
                                                          device=cpu)
    pooled = np.asarray(encode_clip_pooled(clip_tok, clip_enc, prompts))
    t5 = np.asarray(encode_t5_prompt(t5_tok, t5_enc, prompts, max_length=40))
    for name, got, want in (("clip pooled", pooled, want_pooled), ("t5", t5, want_t5)):
        want = want.numpy()
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print(f"flux {name} {got.shape} rel err {err:.2e}")
        assert got.shape == want.shape and err < 1e-5
    assert pooled.shape == (len(prompts), 32) and t5.shape == (len(prompts), 40, 32)
