"""The denoiser protocol: what the generic sampling loop (:mod:`ditax.pipelines.sampling`) and
the step cache (:mod:`ditax.pipelines.cache`) may call on a family's denoiser module, and the
rule for its inputs at one step. Re-exported by :mod:`ditax.models.base`.
"""

from __future__ import annotations

from typing import Any, Protocol


class Embedded(Protocol):
    """What a denoiser's :meth:`Denoiser.embed` hands its blocks and head (any object; a
    ``NamedTuple`` in Wan). The step cache reads these three fields and nothing else."""

    seq: int    # static: the tokens h[:, :seq] that are real (the rest padding), compared
    #             (tokens that are a pytree of streams: a pytree of ints, one a stream)
    mod: Any    # the timestep modulation the blocks read (TeaCache input "modulation")
    temb: Any   # the time embedding (TeaCache input "time_embedding")


class Denoiser(Protocol):
    """A family's denoiser module as the generic sampling loop (:mod:`ditax.pipelines.sampling`)
    and the step cache (:mod:`ditax.pipelines.cache`) use it: an ``nnx.Module`` whose forward is
    ``head(run_blocks(*embed(...)))``.

    ``x``: the denoiser input ``[B, C_in, ...]`` (what :class:`ModelInputs` returns), timestep
    ``[B]`` (or per token ``[B, L]``), text ``[B, T, Dt]``; ``extras``: the family's further
    inputs as keyword arguments (Wan: ``encoder_hidden_states_image``). Tokens ``h`` are one
    array ``[B, L', D]`` (``L'`` may include padding past ``ctx.seq``), or a pytree of such
    streams (LTX-2: ``(video, audio)``; ``ctx.seq`` then a pytree of each stream's real
    tokens, and an optional ``token_axes`` attribute gives each stream's logical axes, default
    ``("act_batch", "act_seq", "act_embed")``), so a cached residual is ``h_after - h_before``
    leaf by leaf. Blocks are numbered across :attr:`block_stacks` in order.
    """

    mesh: Any   # the device mesh the module is sharded over (None: one device)

    @property
    def block_stacks(self) -> tuple[tuple[str, int], ...]:
        """The stacks of blocks, in the order they run: ``((attribute name, depth), ...)``
        (Wan: ``(("blocks", num_layers),)``; a model with two kinds of block lists both)."""

    def __call__(self, x, timestep, text, **extras):
        """The prediction ``[B, C_out, ...]``; equals ``head(run_blocks(h, ctx), ctx)``."""

    def embed(self, x, timestep, text, **extras) -> tuple[Any, Embedded]:
        """Tokens ``h [B, L', D]`` and the context (:class:`Embedded`) blocks and head read."""

    def run_blocks(self, h, ctx: Embedded, start: int = 0, stop: int | None = None):
        """Blocks ``start .. stop-1`` (default all, numbered across the stacks) on ``h``."""

    def head(self, h, ctx: Embedded):
        """Tokens → the prediction ``[B, C_out, ...]`` in the input's dtype."""


class ModelInputs(Protocol):
    """A family's rule for the denoiser's inputs at one sampling step: ``inputs(model,
    condition, latents [B, C, ...] float32, t float32 [] or [B]) → (x, timestep, extras)`` —
    ``t`` is one timestep for every row, or one per row (a continuous batch, whose rows are at
    their own steps: :mod:`ditax.pipelines.continuous`); ``condition`` is the family's per-request pytree (None: text only), ``extras`` a dict of
    keyword arguments for :meth:`Denoiser.embed` whose arrays have the condition's batch
    (doubled, like ``x``, for a batched CFG forward). A module-level function: it is a static
    argument of the compiled step (hashed by identity)."""

    def __call__(self, model, condition, latents, t) -> tuple[Any, Any, dict]:
        ...


def num_blocks(model: Denoiser) -> int:
    """All blocks of ``model``: the sum of its :attr:`~Denoiser.block_stacks` depths."""
    return sum(depth for _, depth in model.block_stacks)


__all__ = ["Embedded", "Denoiser", "ModelInputs", "num_blocks"]
