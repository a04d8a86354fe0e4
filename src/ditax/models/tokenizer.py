"""Text tokenizer for the UMT5 encoder, through the ``tokenizers`` library (no torch).

Wan's pipeline tokenizes with ``padding="max_length", truncation=True, max_length=L,
add_special_tokens=True``: right-padded with the pad id, cut to ``L`` tokens while keeping the
end-of-sequence token that the post-processor appends. :class:`Tokenizer` reproduces that from
the ``tokenizer.json`` of a pipeline's ``tokenizer/`` folder. A prompt cut that way is not cut
silently: a warning (logger ``ditax.models.tokenizer``, shown on the CLI's stderr) names it and
how many of its tokens were dropped.
"""

from __future__ import annotations

import html
import logging
import re

import numpy as np

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


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with the pipeline's padding/truncation contract."""

    def __init__(self, backend, pad_id: int, pad_token: str, padding_side: str = "right"):
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side={padding_side!r}; expected 'right' or 'left'")
        self.backend = backend
        self.pad_id = int(pad_id)
        self.pad_token = pad_token
        self.padding_side = padding_side

    def encode(self, prompts, max_length: int):
        """Prompts → ``(ids int32 [B, max_length], mask int32 [B, max_length])``.

        Adds the special tokens, truncates to ``max_length`` (special tokens kept), pads to
        exactly ``max_length``; ``mask`` is 1 on real tokens and 0 on padding.
        """
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length={max_length!r}; expected a positive int (Wan uses 512)")
        tok = self.backend
        tok.enable_truncation(max_length=max_length)
        tok.enable_padding(direction=self.padding_side, pad_id=self.pad_id,
                           pad_token=self.pad_token, length=max_length)
        encs = tok.encode_batch(list(prompts), add_special_tokens=True)
        ids = np.asarray([e.ids for e in encs], np.int32)
        mask = np.asarray([e.attention_mask for e in encs], np.int32)
        self._warn_truncated([p for p, e in zip(prompts, encs) if e.overflowing], max_length)
        return ids, mask

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


def load_tokenizer(path) -> Tokenizer:
    """Load ``tokenizer.json`` from a tokenizer folder, a pipeline folder's ``tokenizer/`` or a
    hub id (ditax reads the fast tokenizer file: save one with ``tokenizer.save_pretrained``).

    The pad token and padding side come from ``tokenizer_config.json`` /
    ``special_tokens_map.json`` when present, else from ``tokenizer.json``'s padding block,
    else ``<pad>``.
    """
    from tokenizers import Tokenizer as _Backend

    p = resolve_folder(path, "tokenizer", required=("tokenizer.json",))
    raw = read_model_json(p / "tokenizer.json", "tokenizer.json")   # a damaged file: named
    backend = _Backend.from_file(str(p / "tokenizer.json"))
    meta = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if (p / name).is_file():
            meta.update(read_model_json(p / name, name))
    pad_token = meta.get("pad_token")
    if isinstance(pad_token, dict):
        pad_token = pad_token.get("content")
    padding_side = meta.get("padding_side", "right")
    if pad_token is None and raw.get("padding"):
        pad_token = raw["padding"].get("pad_token")
        padding_side = {"Right": "right", "Left": "left"}.get(
            raw["padding"].get("direction"), padding_side)
    pad_token = pad_token or "<pad>"
    pad_id = backend.token_to_id(pad_token)
    if pad_id is None:
        raise ValueError(f"pad token {pad_token!r} is not in the vocabulary of "
                         f"{str(p / 'tokenizer.json')!r}")
    return Tokenizer(backend, pad_id, pad_token, padding_side)
