"""FLUX.2's text-encoder tokenizers with their chat templates, through ``tokenizers`` and
jinja2 (no transformers at run time): Qwen3's (klein) and Mistral's Tekken tokenizer (dev).

- Qwen3: transformers 5's ``Qwen2Tokenizer`` does not run the folder's ``tokenizer.json``
  pipeline as written; it takes the file's BPE vocabulary and merges and rebuilds the rest —
  NFC, Qwen's split regex then byte-level (no prefix space, no second regex), byte-level
  decoding — adds the special tokens (the file's ``added_tokens``, the config's
  ``added_tokens_decoder``, the named ones, ``<|endoftext|>`` by default) and keeps the file's
  post-processor (none where the file has none). :func:`qwen2_backend` does the same.
- Mistral (Mistral Small 3.x's Tekken, a byte-level BPE): without ``mistral_common``
  transformers 5 loads the ``tokenizer.json`` as written (``TokenizersBackend``; a pipeline's
  ``tokenizer/`` folder holds no ``config.json``, so no regex patch applies), and so does
  :func:`load_mistral_tokenizer`.

Both keep the file's post-processor: with a ``tokenizer.json`` present, transformers 5 ignores
the config's ``add_bos_token`` / ``add_eos_token`` (checked against it), and so do these.

Each is a :class:`ChatTokenizer`: the pipelines' padding / truncation contract of
:class:`ditax.models.encoders.tokenizer.Tokenizer`, plus the folder's chat template rendered by
:mod:`.chat_template` with the tokenizer's named special tokens.
"""

from __future__ import annotations

import json
import logging

from ditax.errors import ConfigError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.models.encoders.decoder_lm.chat_template import render_chat_template
from ditax.models.encoders.decoder_lm.tokenizer import _added
from ditax.models.encoders.tokenizer import Tokenizer, _max_length, _meta, _token, arrays

NAMED = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
         "mask_token")

log = logging.getLogger(__name__)

# transformers' Qwen2Tokenizer: its split regex and named-token defaults
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_SPECIAL = {"unk_token": "<|endoftext|>", "bos_token": None, "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>"}


class ChatTokenizer(Tokenizer):
    """A :class:`~ditax.models.encoders.tokenizer.Tokenizer` with a chat template.

    ``chat_template``: the Jinja source (None: the folder has none); ``special_tokens``: the
    named tokens the template sees (``bos_token`` …)."""

    def __init__(self, backend, pad_id, pad_token, padding_side="right",
                 model_max_length=None, chat_template=None, special_tokens=None):
        super().__init__(backend, pad_id, pad_token, padding_side, model_max_length)
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    def apply_chat_template(self, conversations, *, add_generation_prompt=False,
                            **kwargs) -> list[str]:
        """Each conversation (a list of message dicts) rendered to its prompt text, as
        transformers' ``apply_chat_template(..., tokenize=False)``."""
        if self.chat_template is None:
            raise ConfigError("this tokenizer folder has no chat template (chat_template in "
                              "tokenizer_config.json or chat_template.jinja); use the "
                              "pipeline's own tokenizer/ folder")
        return render_chat_template(self.chat_template, conversations,
                                    add_generation_prompt=add_generation_prompt,
                                    special_tokens=self.special_tokens, **kwargs)

    def encode(self, prompts, max_length: int, add_special_tokens: bool = True):
        """As :meth:`Tokenizer.encode`, with ``add_special_tokens`` (False: no
        post-processor tokens, for text a chat template already began with ``<s>``)."""
        if add_special_tokens:
            return super().encode(prompts, max_length)
        prompts, encs = self.encode_batch(prompts, max_length, add_special_tokens=False)
        for p, e in zip(prompts, encs):
            if e.overflowing:     # the dropped count without the post-processor's tokens
                n = max_length + sum(sum(o.attention_mask) for o in e.overflowing)
                short = p if len(p) <= 60 else p[:57] + "..."
                log.warning("prompt %r has %d tokens, more than max_sequence_length=%d: the "
                            "last %d token(s) are dropped (shorten it, or raise "
                            "max_sequence_length)", short, n, max_length, n - max_length)
        return arrays(encs)


def read_chat_template(p, meta: dict):
    """The folder's chat template: ``chat_template.jinja``, else ``chat_template.json``'s,
    else ``tokenizer_config.json``'s (a list of named templates: the ``default`` one);
    None where there is none."""
    if (p / "chat_template.jinja").is_file():
        return (p / "chat_template.jinja").read_text(encoding="utf-8")
    source = meta.get("chat_template")
    if (p / "chat_template.json").is_file():
        source = read_model_json(p / "chat_template.json", "chat_template.json").get(
            "chat_template", source)
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        if "default" not in named:
            raise ConfigError(f"{p} holds chat templates {sorted(named)} and none is named "
                              f"'default'; keep the model's own tokenizer folder")
        source = named["default"]
    if source is not None and not isinstance(source, str):
        raise ConfigError(f"{p}: chat_template is a {type(source).__name__}, not Jinja text")
    return source


def _check_added(tok, added: dict, source: str) -> None:
    """Every added token got the id its file gives it (ids appended in order)."""
    for i, entry in added.items():
        got = tok.token_to_id(entry["content"])
        if got != i:
            raise ConfigError(f"added token {entry['content']!r} has id {i} in {source!r} but "
                              f"lands on {got}; the vocabulary and added_tokens disagree "
                              f"(re-save the tokenizer with transformers)")


def qwen2_backend(raw: dict, meta: dict, source: str):
    """A ``tokenizers.Tokenizer`` from a Qwen2/3 ``tokenizer.json`` (``raw``, parsed) and the
    folder's ``meta``, built as the module docstring says."""
    from tokenizers import AddedToken, Regex
    from tokenizers import Tokenizer as _Backend
    from tokenizers import decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    model = raw.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise ConfigError(f"{source!r} holds a {model.get('type')!r} model; Qwen's tokenizer "
                          f"is a byte-level BPE: point at the pipeline's tokenizer/ folder")
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in model.get("merges", [])]
    tok = _Backend(BPE(vocab=model["vocab"], merges=merges, dropout=None, unk_token=None,
                       continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                       byte_fallback=False))
    tok.decoder = decoders.ByteLevel()
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=bool(meta.get("add_prefix_space") or False),
                                 use_regex=False)])
    added = {int(i): e for i, e in (meta.get("added_tokens_decoder") or {}).items()}
    added.update({int(e["id"]): e for e in raw.get("added_tokens") or []})
    tokens = [_added(added[i]) for i in sorted(added)]
    tok.add_tokens(tokens)
    _check_added(tok, added, source)
    known = {t.content for t in tokens}
    names = [_token(meta, k, v) for k, v in QWEN_SPECIAL.items()]
    extra = [t if isinstance(t, str) else t.get("content")
             for t in meta.get("extra_special_tokens") or meta.get("additional_special_tokens")
             or []]
    tok.add_tokens([AddedToken(t, special=True) for t in dict.fromkeys(names + extra)
                    if t and t not in known])
    if raw.get("post_processor"):
        small = {**raw, "model": {**model, "vocab": {}, "merges": []}, "added_tokens": []}
        tok.post_processor = _Backend.from_str(json.dumps(small)).post_processor
    return tok


def _chat_tokenizer(backend, meta: dict, p, source: str, defaults: dict,
                    side_default: str) -> ChatTokenizer:
    pad = _token(meta, "pad_token", defaults.get("pad_token"))
    if pad is None:
        raise ConfigError(f"{source!r} names no pad token; name one as pad_token in "
                          f"tokenizer_config.json")
    pad_id = backend.token_to_id(pad)
    if pad_id is None:
        raise ConfigError(f"pad token {pad!r} is not in the vocabulary of {source!r}; name one "
                          f"it has as pad_token in tokenizer_config.json")
    side = meta.get("padding_side") or side_default
    # split_special_tokens: special tokens written in the text are split like any text
    backend.encode_special_tokens = bool(meta.get("split_special_tokens", False))
    specials = {k: _token(meta, k, defaults.get(k)) for k in NAMED}
    return ChatTokenizer(backend, pad_id, pad, side, _max_length(meta),
                         read_chat_template(p, meta),
                         {k: v for k, v in specials.items() if v is not None})


def load_qwen3_tokenizer(path, subfolder: str = "tokenizer") -> ChatTokenizer:
    """Qwen3's tokenizer (FLUX.2 klein's ``tokenizer/``): :func:`qwen2_backend` on the folder's
    ``tokenizer.json``, padded with ``<|endoftext|>`` unless the config names another, on the
    config's ``padding_side`` (default right), with the folder's chat template."""
    p = resolve_folder(path, subfolder, required=("tokenizer.json",))
    source = str(p / "tokenizer.json")
    raw = read_model_json(p / "tokenizer.json", "tokenizer.json")
    meta = _meta(p)
    return _chat_tokenizer(qwen2_backend(raw, meta, source), meta, p, source, QWEN_SPECIAL,
                           "right")


def load_mistral_tokenizer(path, subfolder: str = "tokenizer") -> ChatTokenizer:
    """Mistral's tokenizer (FLUX.2 dev's ``tokenizer/``, the Pixtral processor's tokenizer):
    the folder's ``tokenizer.json`` as written, padded with the config's pad token (else the
    file's padding token, else ``<pad>``) on the config's ``padding_side`` (else the file's,
    else right), with the folder's chat template."""
    from tokenizers import Tokenizer as _Backend

    p = resolve_folder(path, subfolder, required=("tokenizer.json",))
    source = str(p / "tokenizer.json")
    raw = read_model_json(p / "tokenizer.json", "tokenizer.json")   # a damaged file: named
    backend = _Backend.from_file(source)
    meta = _meta(p)
    padding = raw.get("padding") or {}
    side = {"Right": "right", "Left": "left"}.get(padding.get("direction"), "right")
    defaults = {"pad_token": padding.get("pad_token") or "<pad>"}
    return _chat_tokenizer(backend, meta, p, source, defaults, side)


__all__ = ["ChatTokenizer", "read_chat_template", "qwen2_backend", "load_qwen3_tokenizer",
           "load_mistral_tokenizer"]
