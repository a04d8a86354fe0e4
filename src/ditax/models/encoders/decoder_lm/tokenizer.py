"""Gemma's tokenizer through the ``tokenizers`` library, tokenizing as transformers 5's
``GemmaTokenizer`` does (no transformers at run time).

transformers 5 does not run a Gemma ``tokenizer.json``'s pipeline as written: it takes the
file's BPE vocabulary and merges and rebuilds the rest — byte-fallback BPE (``fuse_unk``),
spaces replaced by ``▁`` (no pre-split: the whole prompt is one word), the ``▁`` / byte-fallback
decoder — then adds the special tokens (the file's ``added_tokens``, the config's
``added_tokens_decoder``, the named ones) and keeps the file's post-processor (``<bos> $A``;
the config's ``add_bos_token`` / ``add_eos_token`` are dropped when a ``tokenizer.json`` is
there). :func:`gemma_backend` does the same, so a file written by any converter tokenizes as
with transformers 5.
"""

from __future__ import annotations

import json

from ditax.errors import ConfigError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.models.encoders.tokenizer import Tokenizer, _meta, _token

# GemmaTokenizer's defaults for the named special tokens
SPECIAL = {"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>",
           "pad_token": "<pad>", "mask_token": "<mask>"}


def _added(entry: dict):
    from tokenizers import AddedToken

    return AddedToken(entry["content"], special=bool(entry.get("special", False)),
                      normalized=bool(entry.get("normalized", False)),
                      lstrip=bool(entry.get("lstrip", False)),
                      rstrip=bool(entry.get("rstrip", False)),
                      single_word=bool(entry.get("single_word", False)))


def gemma_backend(raw: dict, meta: dict, source: str):
    """A ``tokenizers.Tokenizer`` from a Gemma ``tokenizer.json`` (``raw``, parsed) and the
    folder's ``meta`` (tokenizer_config + special_tokens_map), built as the module docstring
    says."""
    from tokenizers import Tokenizer as _Backend
    from tokenizers import decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    model = raw.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ConfigError(f"{source!r} holds a {model.get('type')!r} model; Gemma's tokenizer "
                          f"is a byte-fallback BPE: point at the pipeline's tokenizer/ folder")
    names = {k: _token(meta, k, v) for k, v in SPECIAL.items()}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in model.get("merges", [])]
    tok = _Backend(BPE(vocab=model["vocab"], merges=merges, fuse_unk=True,
                       unk_token=names["unk_token"], dropout=None, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous",
                                             invert=False)
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    added = {int(i): e for i, e in (meta.get("added_tokens_decoder") or {}).items()}
    added.update({int(e["id"]): e for e in raw.get("added_tokens") or []})
    tokens = [_added(added[i]) for i in sorted(added)]
    known = {t.content for t in tokens}
    extra = [t if isinstance(t, str) else t.get("content")
             for t in meta.get("extra_special_tokens") or meta.get("additional_special_tokens")
             or []]
    tokens += [_added({"content": t, "special": True})
               for t in dict.fromkeys(list(names.values()) + extra) if t and t not in known]
    tok.add_tokens(tokens)
    tok.post_processor = _post_processor(raw)
    return tok


def _post_processor(raw: dict):
    """The file's own post-processor (Gemma's ``<bos> $A``), read from a copy without its
    vocabulary (cheap, as transformers does); None where the file has none. transformers 5
    ignores the config's ``add_bos_token`` / ``add_eos_token`` whenever a ``tokenizer.json``
    is there, and so does this."""
    from tokenizers import Tokenizer as _Backend

    if not raw.get("post_processor"):
        return None
    small = {**raw, "model": {**raw["model"], "vocab": {}, "merges": []}, "added_tokens": []}
    return _Backend.from_str(json.dumps(small)).post_processor


def load_gemma_tokenizer(path, subfolder: str = "tokenizer",
                         padding_side: str | None = None) -> Tokenizer:
    """Gemma's tokenizer from the ``tokenizer.json`` of a tokenizer folder or a pipeline
    folder's ``subfolder/``: :func:`gemma_backend`, padded with ``<pad>`` (its end token where
    the config sets no pad token, as LTX-2's pipeline does) on ``padding_side`` (None: the
    folder's, else the left, GemmaTokenizer's default)."""
    p = resolve_folder(path, subfolder, required=("tokenizer.json",))
    source = str(p / "tokenizer.json")
    raw = read_model_json(p / "tokenizer.json", "tokenizer.json")
    meta = _meta(p)
    backend = gemma_backend(raw, meta, source)
    pad = _token(meta, "pad_token", SPECIAL["pad_token"])
    if pad is None:
        pad = _token(meta, "eos_token", SPECIAL["eos_token"])
    pad_id = backend.token_to_id(pad)
    if pad_id is None:
        raise ConfigError(f"pad token {pad!r} is not in the vocabulary of {source!r}; name one "
                          f"it has as pad_token in tokenizer_config.json")
    if padding_side is None:
        json_side = {"Right": "right", "Left": "left"}.get((raw.get("padding") or {})
                                                           .get("direction"))
        padding_side = meta.get("padding_side") or json_side or "left"
    max_len = meta.get("model_max_length")
    max_len = max_len if isinstance(max_len, int) and 0 < max_len <= 1_000_000 else None
    return Tokenizer(backend, pad_id, pad, padding_side, max_len)


__all__ = ["gemma_backend", "load_gemma_tokenizer"]
