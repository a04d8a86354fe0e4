"""The attention backends and what each can do, declared as data.

Every backend is a :class:`Backend` entry in :data:`BACKENDS`: where its function lives
(imported on first use, so optional dependencies stay optional), its options class
(:mod:`ditax.attention.options`), and its capabilities — platforms it compiles on (and where
it runs interpreted), dtypes, head dims, masks, whether it returns the log-sum-exp a ring
merge needs and whether it can continue from a previous partial result — and the context an
entry point enters around a run that uses it (TE: its global mesh resource). Dispatch, plans and
:func:`ditax.attention.check_available` read these fields; nothing inspects function
signatures.

The options classes are the one vocabulary of options (:func:`option_vocabulary`):
:func:`backend_options` builds a backend's options from ``attend``-style keywords and
:func:`check_options` refuses, in one line, an option that none of the kernels a call runs
takes — for ``attend(...)`` and for the ``attention.<option>`` config keys alike.
"""

from __future__ import annotations

import difflib
import importlib
import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Callable, ContextManager, Optional

import jax.numpy as jnp

from ditax.attention import options as opt
from ditax.errors import AttentionUnavailable
from ditax.parallel.platform import GPU_PLATFORMS, Platform, platform_of

log = logging.getLogger(__name__)

_FIX_GPU = "install ditax[gpu] on a CUDA machine, or use backend='xla'"
_FLASH_OFF_GPU = ("the flash Pallas kernel targets TPU (Mosaic: VMEM scratch, sequential key "
                  "grid axis) and has no GPU lowering; on GPUs use backend='cudnn' or 'te' (or "
                  "out_a2a='chunked'/'flat' around them), or interpret=True for debugging")
_SPLASH_OFF_GPU = ("splash is the Pallas TPU (Mosaic) kernel and has no GPU lowering; on "
                   "{where} it would run in Pallas interpret mode (slow); use backend='cudnn' or "
                   "'te' (or local=cudnn inside ulysses/ring), or interpret=True for debugging")

_SAGE_OFF_GPU = ("the sage Pallas kernel is Mosaic-TPU code and has no GPU lowering; on "
                 "{where} use backend='sage_xla' (the same 8-bit attention in XLA), or "
                 "interpret=True for debugging")


@dataclass(frozen=True)
class Backend:
    """One attention backend and its declared capabilities.

    ``compiled_on``: platforms the kernel compiles for (None: plain XLA, every platform).
    ``interpreted_on``: Pallas kernels: platforms where it runs in interpret mode by default
    (None: every platform it does not compile on). ``refuses_on``: platforms where it cannot
    run compiled (None: every platform outside ``compiled_on``); there it refuses with
    ``off_platform`` (the reason and the fix; ``{where}`` names the platform's origin)
    unless asked to interpret.
    ``lse``: ``"kernel"`` returns the log-sum-exp, ``"beside"`` the ring computes it next to
    the kernel in jnp (one extra ``QK^T``), ``"none"`` cannot serve a ring.
    ``carries``: continues an online softmax from a previous partial ``(o, lse)``.
    ``masks``: ``"any"`` key mask or only ``"prefix"`` masks (valid keys first).
    ``ring_local``: for a kernel with ``lse="none"``, the kernel a ring runs in its place
    (named in a log line once); None: a ring refuses it.
    ``entry_context``: ``"module:function"``, ``function(mesh, say)`` returning the context
    manager an entry point enters around a run that uses this backend (``say`` announces
    it); None: it needs none.
    ``head_major``: the kernel also reads and writes head-major ``[B, N, L, K]`` itself
    (its function takes ``head_major=True``); other kernels get it through a transpose.
    """

    name: str
    target: str                                    # "module:function"
    options: type = opt.NoOptions
    kind: str = "local"                            # "local" | "sequence"
    compiled_on: Optional[tuple[str, ...]] = None
    interpreted_on: Optional[tuple[str, ...]] = ()
    refuses_on: Optional[tuple[str, ...]] = None
    off_platform: str = ""
    dtypes: Optional[tuple[str, ...]] = None       # None: any floating dtype
    head_dim_multiple: int = 1
    head_dim_limit: Optional[Callable[[Platform], int]] = None
    title: str = ""                                # kernel name in head-dim messages
    masks: str = "any"
    lse: str = "none"
    carries: bool = False
    ring_local: Optional[str] = None
    requires: Optional[str] = None                 # importable module it needs
    requires_fix: str = ""
    entry_context: Optional[str] = None            # "module:function"(mesh, say)
    head_major: bool = False                       # takes head_major=True ([B, N, L, K])

    def load(self) -> Callable:
        """The backend function (its module imported on first use)."""
        return _load(self.target)

    def enter(self, mesh=None, say=print) -> ContextManager:
        """The context an entry point wraps a run using this backend in (a no-op when it
        declares none)."""
        if self.entry_context is None:
            return contextlib.nullcontext()
        return _load(self.entry_context)(mesh, say)

    def default_interpret(self, platform: Platform) -> Optional[bool]:
        """Pallas interpret mode when ``interpret=None``: off the platforms it compiles on."""
        if self.compiled_on is None:
            return None
        if platform.name in self.compiled_on:
            return False
        return self.interpreted_on is None or platform.name in self.interpreted_on

    def platform_reason(self, platform: Platform, interpret: Optional[bool] = None):
        """Why it cannot run (compiled, or as ``interpret`` says) on ``platform``; or None."""
        if self.compiled_on is None or platform.name in self.compiled_on:
            return None
        interpret = self.default_interpret(platform) if interpret is None else interpret
        if interpret and "interpret" in self.options.names():
            return None
        if self.refuses_on is not None and platform.name not in self.refuses_on:
            return None
        return self.off_platform.format(where=platform.describe())

    def refusal(self, platform: Platform, *, dtype=None, head_dim: Optional[int] = None,
                interpret: Optional[bool] = None) -> Optional[str]:
        """The first unmet condition on ``platform`` for these inputs, as a message naming
        the backend, the value and the fix; None when it can run."""
        why = self.platform_reason(platform, interpret)
        if why is not None:
            return f"attention backend {self.name!r} is unavailable: {why}"
        if self.requires is not None:
            from ditax.attention.platform import module_available

            if not module_available(self.requires):
                return (f"attention backend {self.name!r} is unavailable: {self.requires} is "
                        f"not importable; {self.requires_fix}")
        if dtype is not None and self.dtypes is not None:
            name = jnp.dtype(dtype).name
            if name not in self.dtypes:
                return (f"attention backend {self.name!r} needs {' or '.join(self.dtypes)} "
                        f"q/k/v, got {name}; cast the inputs (e.g. model dtype='bfloat16') "
                        f"or use backend='xla'")
        if head_dim is not None and self.head_dim_limit is not None:
            limit = self.head_dim_limit(platform)
            if head_dim % self.head_dim_multiple or head_dim > limit:
                return (f"attention backend {self.name!r}: head dim K={head_dim} is not "
                        f"supported by {self.title} (needs a multiple of "
                        f"{self.head_dim_multiple} and <= {limit} on this GPU); use "
                        f"backend='xla' or 'blockwise'")
        return None

    def require(self, platform: Platform, **inputs) -> None:
        """Raise :class:`AttentionUnavailable` with :meth:`refusal`'s message."""
        why = self.refusal(platform, **inputs)
        if why is not None:
            raise AttentionUnavailable(why)

    def resolve(self, options, platform: Platform):
        """``options`` with ``interpret=None`` decided for ``platform`` (for a sequence
        backend: for its local kernel)."""
        if "interpret" not in options.names() or options.interpret is not None:
            return options
        entry = BACKENDS.get(getattr(options, "local", self.name))
        interpret = entry.default_interpret(platform) if entry is not None else None
        return options if interpret is None else replace(options, interpret=interpret)


def cudnn_head_dim_limit(platform: Platform) -> int:
    """Largest head dim cuDNN flash attention takes: 256 from Hopper (9.0) on, else 128."""
    cc = platform.compute_capability
    return 256 if cc is not None and cc >= (9, 0) else 128


_CUDA = dict(compiled_on=("cuda",), interpreted_on=(),
             off_platform="no CUDA GPU visible: {where}; " + _FIX_GPU,
             dtypes=("float16", "bfloat16"), head_dim_multiple=8,
             head_dim_limit=cudnn_head_dim_limit)
_SEQ = "ditax.attention.sequence:sequence_parallel_attention"

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("reference", "ditax.attention.reference:reference_attention", lse="kernel"),
    Backend("xla", "ditax.attention.xla:xla_attention", lse="beside"),
    Backend("blockwise", "ditax.attention.blockwise:blockwise_attention",
            opt.BlockwiseOptions, lse="kernel"),
    Backend("splash", "ditax.attention.splash:splash_attention", opt.SplashOptions,
            compiled_on=("tpu",), interpreted_on=("cpu",), refuses_on=GPU_PLATFORMS,
            off_platform=_SPLASH_OFF_GPU, lse="kernel", head_major=True),
    Backend("flash", "ditax.attention.flash:flash_attention", opt.FlashOptions,
            compiled_on=("tpu",), interpreted_on=("cpu",), refuses_on=GPU_PLATFORMS,
            off_platform=_FLASH_OFF_GPU,
            dtypes=("float32", "bfloat16", "float16"), lse="kernel", carries=True,
            head_major=True),
    Backend("cudnn", "ditax.attention.cudnn:cudnn_attention",
            title="cuDNN flash attention", masks="prefix", ring_local="blockwise", **_CUDA),
    Backend("te", "ditax.attention.te:te_attention", title="TransformerEngine fused attention",
            masks="prefix", ring_local="blockwise", requires="transformer_engine.jax",
            requires_fix="install ditax[gpu] (transformer-engine[jax]) on a CUDA machine, or "
                         "use backend='xla'", entry_context="ditax.attention.te:te_entry_context",
            **_CUDA),
    # 8-bit attention (ditax.attention.sage): int8 Q·Kᵀ per block (K mean-smoothed), float32
    # softmax, P·V in v's dtype; any key mask; lse of the true scores (a ring step); forward
    # only: differentiating it raises (inference kernels).
    Backend("sage", "ditax.attention.sage:sage_attention", opt.SageOptions,
            compiled_on=("tpu",), interpreted_on=("cpu",), refuses_on=GPU_PLATFORMS,
            off_platform=_SAGE_OFF_GPU, dtypes=("float32", "bfloat16", "float16"),
            lse="kernel", head_major=True),
    Backend("sage_xla", "ditax.attention.sage:sage_xla_attention", opt.SageXlaOptions,
            dtypes=("float32", "bfloat16", "float16"), lse="kernel", head_major=True),
    Backend("ulysses", _SEQ, opt.SequenceOptions, kind="sequence"),
    Backend("ring", _SEQ, opt.SequenceOptions, kind="sequence"),
    Backend("ulysses_ring", _SEQ, opt.UlyssesRingOptions, kind="sequence"),
)}

#: the sequence-parallel backends (each wraps a local kernel)
SEQUENCE_BACKENDS = tuple(name for name, b in BACKENDS.items() if b.kind == "sequence")

_AUTO = {"tpu": "splash", "cuda": "cudnn"}
_AUTO_FALLBACK = {"cuda": "blockwise"}     # when the platform's kernel refuses the inputs
#: every kernel ``backend="auto"`` may run (on some platform, for some inputs)
AUTO_CHOICES = tuple(dict.fromkeys((*_AUTO.values(), *_AUTO_FALLBACK.values(), "xla")))
_logged: set = set()


def auto_backend(platform: Platform | str | None = None, *, dtype=None,
                 head_dim: Optional[int] = None) -> str:
    """What ``backend="auto"`` runs: TPU → splash, CUDA GPU → cudnn, otherwise xla.

    Dtype- and shape-aware: when the platform's kernel refuses these inputs (cuDNN takes
    float16/bfloat16 and head dims that are multiples of 8 up to 128, or 256 from sm 9.0),
    CUDA falls back to ``blockwise`` (any dtype and head dim, ``O(L·block)`` memory where
    ``xla`` would hold the ``[L, L]`` scores). Logged once per (platform, dtype, head dim).
    """
    if platform is None:
        platform = platform_of()
    if not isinstance(platform, Platform):
        name = {"gpu": "cuda"}.get(platform, platform)
        platform = Platform(name)
    choice = _AUTO.get(platform.name, "xla")
    why = BACKENDS[choice].refusal(platform, dtype=dtype, head_dim=head_dim)
    if why is not None:
        choice = _AUTO_FALLBACK.get(platform.name, "xla")
    dname = None if dtype is None else jnp.dtype(dtype).name
    key = ("auto", platform.name, dname, head_dim)
    if key not in _logged:
        _logged.add(key)
        log.info("attention backend=auto on %s (%s, K=%s) -> %s%s", platform.name, dname,
                 head_dim, choice, "" if why is None else f" ({why})")
    return choice


def ring_kernel(entry: Backend, backend: str) -> Backend:
    """The local kernel a ring (``ring`` / ``ulysses_ring`` with R > 1) runs for ``entry``.

    The ring merges partial results by their log-sum-exp, so it needs a kernel that returns
    it (``lse`` "kernel" or "beside"). cuDNN and TE do not through a public API
    (``jax.nn.dot_product_attention(return_residual=True)`` casts the residual to the q dtype
    and its VJP ignores the residual's cotangent), so the ring runs their ``ring_local``
    (``blockwise``) instead, and says so once. Any other kernel without an lse is refused.
    """
    if entry.lse != "none":
        return entry
    if entry.ring_local is None:
        raise ValueError(f"local={entry.name!r} cannot return the log-sum-exp the ring merge "
                         f"needs; use local='flash', 'blockwise', 'reference' or 'xla'")
    key = ("ring", backend, entry.name)
    if key not in _logged:
        _logged.add(key)
        log.warning("%s: local=%s returns no differentiable float32 log-sum-exp, which the ring "
                    "merge needs; the ring steps run local=%s instead", backend, entry.name,
                    entry.ring_local)
    return BACKENDS[entry.ring_local]


def _load(target: str):
    mod_name, fn_name = target.split(":")
    return getattr(importlib.import_module(mod_name), fn_name)


def get(name: str) -> Backend:
    """The registry entry for ``name``; ValueError with a suggestion for an unknown name."""
    if name in BACKENDS:
        return BACKENDS[name]
    close = difflib.get_close_matches(str(name), list(BACKENDS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown attention backend {name!r}{hint}; "
                     f"choose one of: auto, {', '.join(BACKENDS)}")


# ---------------------------------------------------------------- the options vocabulary

# where an option applies, in words, where "backend a, b" would say less
_APPLIES = {"out_a2a": "the Ulysses output exchange (backend ulysses or ulysses_ring)"}


def _applies(option: str, backends: tuple[str, ...]) -> str:
    if option in _APPLIES:
        return _APPLIES[option]
    if not backends:
        return "no backend (it is no attention option)"
    return ("backend " if len(backends) == 1 else "backends ") + ", ".join(backends)


def takes(name: str) -> tuple[str, ...]:
    """The option names backend ``name`` takes (its options class's fields); for ``auto``
    those of any kernel it may choose (:data:`AUTO_CHOICES`)."""
    if name == "auto":
        return tuple(dict.fromkeys(n for c in AUTO_CHOICES for n in get(c).options.names()))
    return get(name).options.names()


def option_vocabulary() -> dict[str, tuple[str, ...]]:
    """``{option: backends that take it}`` over every backend's options class — every
    keyword ``attend`` takes for some backend, and every ``attention.<option>`` config key
    besides ``backend`` / ``cross_backend``."""
    out: dict[str, list[str]] = {}
    for name, entry in BACKENDS.items():
        for option in entry.options.names():
            out.setdefault(option, []).append(name)
    return {k: tuple(v) for k, v in out.items()}


def check_options(backend: str, given: dict, *, local: Optional[str] = None,
                  cross: Optional[str] = None) -> None:
    """Raise :class:`~ditax.attention.options.OptionError` (a ConfigError and a TypeError)
    when an option in ``given`` applies to none of the kernels a call runs: ``backend``, for
    a sequence backend also its ``local`` kernel, and the cross-attention backend ``cross``
    (a config's; None: the same kernels). One line naming the backend and what it takes —
    the same words for ``attend(...)`` and for the config."""
    names = [n for n in (backend, local, cross) if n is not None]
    accepted = set().union(*(takes(n) for n in names))
    bad = sorted(set(given) - accepted)
    if not bad:
        return
    vocab = option_vocabulary()
    withs = [f"{k}={n!r}" for k, n in (("local", local), ("cross_backend", cross))
             if n is not None and n != backend]
    shown = f"{sorted(accepted)}" if accepted else "none"
    if withs:
        shown += f" (with {', '.join(withs)})"
    where = [f"{k}={given[k]!r} applies to " + _applies(k, vocab.get(k, ())) for k in bad]
    raise opt.OptionError(f"attention backend {backend!r} does not take option(s) {bad}; it "
                          f"takes {shown}; " + "; ".join(where))


def backend_options(name: str, values: dict) -> opt.Options:
    """The options object of backend ``name`` from ``attend``-style keywords ``values``
    (:func:`check_options` first). A sequence backend keeps the options of its local kernel
    that are not its own in ``local_options`` (e.g. ``fused_bwd`` for ``local="splash"``)."""
    entry = get(name)
    if entry.kind != "sequence":
        check_options(name, values)
        return entry.options(**values)
    local = values.get("local", entry.options.local)
    check_options(name, values, local=local)
    own = {k: v for k, v in values.items() if k in entry.options.names()}
    rest = tuple(sorted((k, v) for k, v in values.items() if k not in own))
    return entry.options(**own, local_options=rest)


__all__ = ["Backend", "BACKENDS", "SEQUENCE_BACKENDS", "AUTO_CHOICES", "auto_backend", "ring_kernel", "get",
           "cudnn_head_dim_limit", "option_vocabulary", "takes", "check_options",
           "backend_options"]
