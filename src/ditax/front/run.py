"""The one run context every command that runs a model enters (``generate``, ``train``,
``bench``, ``calibrate-cache``), so what surrounds a run is written once.

:func:`run_context` enters, outermost first: the entry contexts the configured attention
backends declare in the registry (TE: its global ``MeshResource``, announced on stdout;
:func:`ditax.attention.plan.entry_context`), jax's persistent compilation cache
(:mod:`ditax.compile_cache`; the folder is what the ``with`` yields, None = off), the status
line on stderr (``status=True``, :mod:`ditax.front.status`), the precision every dot and
convolution traced inside runs at (``precision``: ``model.precision`` resolved by
:func:`~ditax.models.common.fields.matmul_precision`; jax's ``default_matmul_precision``, part
of every program's cache key) and, when named, the run's phase (:mod:`ditax.phases`: an
out-of-memory names it). Nothing here is process-wide: each part
restores what it changed on exit.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional


@contextlib.contextmanager
def run_context(attention_cfg, mesh=None, *, compile_cache="auto", status: bool = False,
                phase: Optional[str] = None, say=print,
                precision: Optional[str] = None) -> Iterator:
    """Enter what a command's run needs for ``attention_cfg`` (an
    :class:`~ditax.attention.config.AttentionConfig`) on ``mesh``; yields the compile cache
    folder (None when off). ``compile_cache``: the ``compile_cache`` config value (``auto``,
    ``none`` or a folder); ``precision``: ``default`` / ``high`` / ``highest`` (None: jax's
    setting as it is)."""
    import jax

    from ditax.attention.plan import entry_context
    from ditax.front.status import status_line
    from ditax.compile_cache import compile_cache as cache_scope
    from ditax.phases import phase as phase_scope

    with contextlib.ExitStack() as stack:
        stack.enter_context(entry_context(attention_cfg, mesh, say))
        folder = stack.enter_context(cache_scope(compile_cache))
        stack.enter_context(status_line(status))
        if precision is not None:
            stack.enter_context(jax.default_matmul_precision(precision))
        if phase is not None:
            stack.enter_context(phase_scope(phase))
        yield folder


__all__ = ["run_context"]
