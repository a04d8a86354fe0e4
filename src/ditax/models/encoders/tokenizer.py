"""Text tokenizers for the T5 / UMT5 and CLIP encoders, through the ``tokenizers`` library
(no torch, no transformers).

Wan's and FLUX.1's pipelines tokenize with ``padding="max_length", truncation=True,
max_length=L``: right-padded with the pad id, cut to ``L`` tokens while keeping the special
tokens the post-processor adds (T5's ``</s>``; CLIP's start and end tokens).
:class:`Tokenizer` reproduces that from

- the ``tokenizer.json`` of a pipeline's ``tokenizer/`` folder as saved (Wan's UMT5):
  :func:`load_tokenizer`;
- FLUX.1's two, built the way transformers' ``T5TokenizerFast`` and ``CLIPTokenizer`` build
  their backends, whatever converter wrote the files: the T5 vocabulary of ``tokenizer_2/``'s
  ``tokenizer.json`` (:func:`load_t5_tokenizer`), the CLIP ``vocab.json`` + ``merges.txt`` of
  ``tokenizer/`` (:func:`load_clip_tokenizer`; FLUX.1's has no ``tokenizer.json``).

A prompt cut that way is not cut silently: a warning (logger ``ditax.models.encoders.tokenizer``,
shown on the CLI's stderr) names it and how many of its tokens were dropped.
"""

from __future__ import annotations

import html
import logging
import pathlib
import re

import numpy as np

from ditax.errors import ConfigError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder

log = logging.getLogger(__name__)


def clean_prompt(text: str) -> str:
    """The Wan pipeline's prompt cleaning: HTML-unescape twice, collapse whitespace, strip.

    (diffusers additionally runs ``ftfy.fix_text`` when ftfy is installed; ditax does the same,
    so results agree whether or not it is present on both sides.)
    """
    try:
        import ftfy  # optional, as in the reference
        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def arrays(encs) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int32 [B, T], mask int32 [B, T])`` of the backend's encodings."""
    return (np.asarray([e.ids for e in encs], np.int32),
            np.asarray([e.attention_mask for e in encs], np.int32))


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with the pipeline's padding/truncation contract."""

    def __init__(self, backend, pad_id: int, pad_token: str, padding_side: str = "right",
                 model_max_length: int | None = None):
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side={padding_side!r}; expected 'right' or 'left'")
        self.backend = backend
        self.pad_id = int(pad_id)
        self.pad_token = pad_token
        self.padding_side = padding_side
        self.model_max_length = model_max_length  # tokenizer_config.json's (CLIP: 77), or None

    def encode(self, prompts, max_length: int):
        """Prompts → ``(ids int32 [B, max_length], mask int32 [B, max_length])``.

        Adds the special tokens, truncates to ``max_length`` (special tokens kept), pads to
        exactly ``max_length``; ``mask`` is 1 on real tokens and 0 on padding.
        """
        prompts, encs = self.encode_batch(prompts, max_length, add_special_tokens=True)
        self._warn_truncated([p for p, e in zip(prompts, encs) if e.overflowing], max_length)
        return arrays(encs)

    def encode_batch(self, prompts, max_length: int, add_special_tokens: bool):
        """``(prompts as a list, the backend's encodings)``: truncated and padded to exactly
        ``max_length`` tokens on :attr:`padding_side`."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length={max_length!r}; expected a positive int (e.g. 512)")
        tok = self.backend
        tok.enable_truncation(max_length=max_length)
        tok.enable_padding(direction=self.padding_side, pad_id=self.pad_id,
                           pad_token=self.pad_token, length=max_length)
        return prompts, tok.encode_batch(list(prompts), add_special_tokens=add_special_tokens)

    def _warn_truncated(self, prompts, max_length: int) -> None:
        """One warning per prompt longer than ``max_length`` tokens (its full length counted
        without truncation), naming it and how many tokens were dropped."""
        if not prompts:
            return
        tok = self.backend
        tok.no_truncation()
        tok.no_padding()
        try:
            for prompt in prompts:
                n = len(tok.encode(prompt, add_special_tokens=True).ids)
                if n > max_length:
                    short = prompt if len(prompt) <= 60 else prompt[:57] + "..."
                    log.warning("prompt %r has %d tokens, more than max_sequence_length=%d: "
                                "the last %d token(s) are dropped (shorten it, or raise "
                                "max_sequence_length / sample.max_sequence_length)",
                                short, n, max_length, n - max_length)
        finally:
            tok.enable_truncation(max_length=max_length)


def _meta(p) -> dict:
    """``special_tokens_map.json`` then ``tokenizer_config.json`` of folder ``p`` (the latter
    wins), each where present."""
    meta = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if (p / name).is_file():
            meta.update(read_model_json(p / name, name))
    return meta


def _token(meta: dict, key: str, default=None):
    """A special token's text from the folder's metadata (a string or an AddedToken dict)."""
    value = meta.get(key, default)
    return value.get("content") if isinstance(value, dict) else value


def _max_length(meta: dict) -> int | None:
    """``model_max_length``, or None where it is absent or transformers' "unset" sentinel."""
    n = meta.get("model_max_length")
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1_000_000 else None


def _tokenizer(backend, meta: dict, source: str, fallback=None) -> Tokenizer:
    """The :class:`Tokenizer` of ``backend``: pad token and side from ``meta``, else from
    ``fallback`` = ``(pad_token, side or None)``, else ``<pad>`` on the right."""
    pad_token = _token(meta, "pad_token")
    side = meta.get("padding_side", "right")
    if pad_token is None and fallback is not None:
        pad_token, side = fallback[0], fallback[1] or side
    pad_token = pad_token or "<pad>"
    pad_id = backend.token_to_id(pad_token)
    if pad_id is None:
        raise ConfigError(f"pad token {pad_token!r} is not in the vocabulary of {source!r}; "
                          f"name one it has as pad_token in tokenizer_config.json")
    return Tokenizer(backend, pad_id, pad_token, side, _max_length(meta))


def load_tokenizer(path, subfolder: str = "tokenizer") -> Tokenizer:
    """Load ``tokenizer.json`` from a tokenizer folder, a pipeline folder's ``subfolder/`` or a
    hub id (ditax reads the fast tokenizer file as saved: write one with
    ``tokenizer.save_pretrained``).

    The pad token and padding side come from ``tokenizer_config.json`` /
    ``special_tokens_map.json`` when present, else from ``tokenizer.json``'s padding block,
    else ``<pad>``.
    """
    from tokenizers import Tokenizer as _Backend

    p = resolve_folder(path, subfolder, required=("tokenizer.json",))
    raw = read_model_json(p / "tokenizer.json", "tokenizer.json")   # a damaged file: named
    backend = _Backend.from_file(str(p / "tokenizer.json"))
    fallback = None
    if raw.get("padding"):
        side = {"Right": "right", "Left": "left"}.get(raw["padding"].get("direction"))
        fallback = (raw["padding"].get("pad_token"), side)
    return _tokenizer(backend, _meta(p), str(p / "tokenizer.json"), fallback)


def t5_backend(p: pathlib.Path, meta: dict):
    """``p/tokenizer.json`` tokenizing as transformers' ``T5TokenizerFast`` does: the file's
    Unigram vocabulary, added tokens and SentencePiece normaliser (its ``Precompiled`` part;
    any other normaliser is dropped), then T5's own pre-tokenizer (split on whitespace, ``▁``
    before each word: runs of whitespace count once, leading / trailing whitespace not at
    all, as SentencePiece does) and ``$A </s>``. Files written by older converters (a
    ``Replace`` normaliser, Metaspace alone) therefore tokenize as with transformers 5."""
    import base64

    from tokenizers import Tokenizer as _Backend
    from tokenizers import normalizers, pre_tokenizers, processors

    raw = read_model_json(p / "tokenizer.json", "tokenizer.json")   # a damaged file: named
    tok = _Backend.from_file(str(p / "tokenizer.json"))
    norm = raw.get("normalizer") or {}
    parts = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    charsmaps = [n["precompiled_charsmap"] for n in parts
                 if n.get("type") == "Precompiled" and n.get("precompiled_charsmap")]
    tok.normalizer = (normalizers.Precompiled(base64.b64decode(charsmaps[0])) if charsmaps
                      else None)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    eos = _token(meta, "eos_token", "</s>")
    if tok.token_to_id(eos) is None:
        raise ConfigError(f"end token {eos!r} is not in the vocabulary of "
                          f"{str(p / 'tokenizer.json')!r}; name the folder's own as eos_token "
                          f"in tokenizer_config.json")
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tok.token_to_id(eos))])
    return tok


def load_t5_tokenizer(path, subfolder: str = "tokenizer_2") -> Tokenizer:
    """FLUX.1's T5 tokenizer (``T5TokenizerFast``): :func:`t5_backend` on the
    ``tokenizer.json`` of a pipeline folder's ``tokenizer_2/`` (or of the folder itself),
    padded with ``<pad>`` unless the folder names another. A folder with only the
    SentencePiece ``spiece.model`` is refused, naming how to write its ``tokenizer.json``."""
    from ditax.errors import ModelNotFound

    try:
        p = resolve_folder(path, subfolder, required=("tokenizer.json",))
    except ModelNotFound:
        for q in (pathlib.Path(path) / subfolder, pathlib.Path(path)):
            if (q / "spiece.model").is_file():
                raise ModelNotFound(
                    f"{q} has spiece.model but no tokenizer.json; ditax reads the fast "
                    f"tokenizer file: write it once with transformers, "
                    f"T5TokenizerFast.from_pretrained(DIR).save_pretrained(DIR)") from None
        raise
    meta = _meta(p)
    return _tokenizer(t5_backend(p, meta), meta, str(p / "tokenizer.json"))


# OpenAI CLIP's pre-tokenization: its two special tokens, English contractions, runs of
# letters, single digits, runs of other non-space characters
_CLIP_SPLIT = (r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]"
               r"|[^\s\p{L}\p{N}]+")


def clip_backend(vocab: dict, merges: list, meta: dict):
    """A ``tokenizers.Tokenizer`` that tokenizes as transformers' ``CLIPTokenizer``: NFC,
    whitespace runs to one space, lower case; split by :data:`_CLIP_SPLIT`; byte-level BPE
    with ``</w>`` ending each word; ``<|startoftext|> ... <|endoftext|>`` around the ids.
    The special tokens (``meta``: the folder's tokenizer_config / special_tokens_map) are
    matched as whole tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer as _Backend
    from tokenizers import decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    bos = _token(meta, "bos_token", "<|startoftext|>")
    eos = _token(meta, "eos_token", "<|endoftext|>")
    unk = _token(meta, "unk_token", "<|endoftext|>")
    tok = _Backend(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                       end_of_word_suffix="</w>", fuse_unk=False, unk_token=unk))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(),
                                           normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    added = meta.get("added_tokens_decoder") or {}
    specials = [AddedToken(t["content"], special=bool(t.get("special", True)),
                           normalized=bool(t.get("normalized", False)),
                           lstrip=bool(t.get("lstrip", False)), rstrip=bool(t.get("rstrip", False)),
                           single_word=bool(t.get("single_word", False)))
                for _, t in sorted(added.items(), key=lambda kv: int(kv[0]))]
    known = {str(t) for t in specials}
    pad = _token(meta, "pad_token", "<|endoftext|>")
    specials += [AddedToken(t, special=True) for t in dict.fromkeys((bos, eos, unk, pad))
                 if t not in known]
    tok.add_special_tokens(specials)
    ids = {t: tok.token_to_id(t) for t in (bos, eos)}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ConfigError(f"CLIP special token(s) {missing} are not in vocab.json; name the "
                          f"folder's own as bos_token / eos_token in tokenizer_config.json")
    tok.post_processor = processors.RobertaProcessing((eos, ids[eos]), (bos, ids[bos]),
                                                      trim_offsets=False, add_prefix_space=False)
    return tok


def load_clip_tokenizer(path, subfolder: str = "tokenizer") -> Tokenizer:
    """FLUX.1's CLIP tokenizer (``CLIPTokenizer``, max length 77 from its
    ``tokenizer_config.json``): :func:`clip_backend` on the vocabulary and merges of a
    pipeline folder's ``tokenizer/`` (or of the folder itself): its ``tokenizer.json``'s
    where it has one (as transformers 5 reads it), else ``vocab.json`` + ``merges.txt``
    (FLUX.1's folder). Pads with ``<|endoftext|>`` unless the folder names another."""
    from tokenizers.models import BPE

    from ditax.errors import ModelNotFound

    try:
        p = resolve_folder(path, subfolder, required=("vocab.json", "merges.txt"))
    except ModelNotFound:
        p = resolve_folder(path, subfolder, required=("tokenizer.json",))
    meta = _meta(p)
    if (p / "tokenizer.json").is_file():
        source = p / "tokenizer.json"
        model = read_model_json(source, "tokenizer.json").get("model") or {}
        if model.get("type") != "BPE":
            raise ConfigError(f"{str(source)!r} holds a {model.get('type')!r} model; a CLIP "
                              f"tokenizer is byte-level BPE: point at the CLIP tokenizer/ folder")
        vocab = model["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                  for m in model["merges"]]
    else:
        source = p / "vocab.json"
        read_model_json(source, "CLIP vocab.json")                   # a damaged file: named
        vocab, merges = BPE.read_file(str(source), str(p / "merges.txt"))
    return _tokenizer(clip_backend(vocab, merges, meta), meta, str(source),
                      ("<|endoftext|>", None))
