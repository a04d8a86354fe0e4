"""What ``ditax preprocess`` needs from a model family: its :class:`Encoders` (latents, text,
the per-clip condition) and what they return (:class:`TextEncoding`), or :class:`SkipClip` for
a clip the family cannot train on. A family's :meth:`ditax.models.base.ModelFamily.
load_encoders` returns an :class:`Encoders` subclass; :mod:`ditax.models.base` re-exports
these names."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any


@dataclasses.dataclass
class TextEncoding:
    """A text encoder's output for ``B`` captions: ``embeddings [B, T, Dt]``, ``mask [B, T]``
    (1 = token), and ``extra``: further per-caption outputs by name (Flux: a pooled vector
    ``"pooled" [B, Dp]``), stored with each sample beside its condition entries, so the family
    declares them in :meth:`ModelFamily.condition_shapes` and reads them in ``condition``."""

    embeddings: Any
    mask: Any
    extra: dict = dataclasses.field(default_factory=dict)


class SkipClip(Exception):
    """Raised by :meth:`Encoders.encode_condition` for a clip the family cannot train on (an
    LTX-2 clip without a sound track): ``ditax preprocess`` says the message in one line
    naming the clip and leaves the clip out of the dataset."""


class Encoders(abc.ABC):
    """What preprocessing needs from a family: its latent encoder, its text encoder and the
    per-clip condition (image-to-video); a family's :meth:`ModelFamily.load_encoders` returns
    a subclass."""

    # whether :meth:`encode_condition` also takes the clip's file (``clip=`` its path): a
    # family whose condition reads more of the file than its decoded frames (LTX-2: the sound
    # track over the frames' span)
    reads_clip: bool = False

    @abc.abstractmethod
    def encode_video(self, video) -> Any:
        """``[B, 3, F, H, W]`` in ``[-1, 1]`` → latents ``[B, C, F', Y, X]`` in the space the
        denoiser is trained in (an image family takes ``F = 1``)."""

    @abc.abstractmethod
    def encode_text(self, captions: list[str], text_len: int) -> TextEncoding:
        """Captions → :class:`TextEncoding` (embeddings ``[B, T, Dt]``, ``T = text_len``)."""

    # the per-clip sidecar files ``ditax preprocess`` reads for :meth:`encode_condition`
    # (``NAME.control.mp4``, ``NAME.mask.mp4``: ``control`` / ``mask`` videos; ``NAME.ref.png``,
    # ``NAME.ref2.png``...: ``references`` images); none by default
    sidecars: tuple[str, ...] = ()

    def encode_condition(self, video, **sidecars) -> dict:
        """Per-clip condition entries (name → array) for one clip ``[3, F, H, W]`` in [-1, 1],
        as :meth:`ModelFamily.condition_shapes` declares them, from the clip and its
        :attr:`sidecars` (videos ``[3, F, H, W]`` in [-1, 1], images as PIL; with
        :attr:`reads_clip` also ``clip=`` the clip's path); none by default. A clip the family
        cannot train on raises :class:`SkipClip` (preprocess leaves it out, in one line)."""
        return {}

    def sample_latents(self, latents, condition: dict):
        """The latents ``[C, F', Y, X]`` stored for a clip with its ``condition`` entries (a
        family whose condition adds latent frames prepends them here); unchanged by default."""
        return latents


__all__ = ["Encoders", "SkipClip", "TextEncoding"]
