"""The attention backends and what each can do, declared as data.

Every backend is a :class:`Backend` entry in :data:`BACKENDS`: where its function lives
(imported on first use, so optional dependencies stay optional), its options class
(:mod:`ditax.attention.options`), and its capabilities — platforms it compiles on (and where
it runs interpreted), dtypes, head dims, masks, whether it returns the log-sum-exp a ring
merge needs and whether it can continue from a previous partial result. Dispatch, plans and
:func:`ditax.attention.check_available` read these fields; nothing inspects function
signatures.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from dataclasses import dataclass, replace
from typing import Callable, Optional

import jax.numpy as jnp

from ditax.attention import options as opt
from ditax.attention.config import LOCAL_BACKENDS, PARALLEL_BACKENDS
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

    def load(self) -> Callable:
        """The backend function (its module imported on first use)."""
        mod_name, fn_name = self.target.split(":")
        return getattr(importlib.import_module(mod_name), fn_name)

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
            off_platform=_SPLASH_OFF_GPU, lse="kernel"),
    Backend("flash", "ditax.attention.flash:flash_attention", opt.FlashOptions,
            compiled_on=("tpu",), interpreted_on=("cpu",), refuses_on=GPU_PLATFORMS,
            off_platform=_FLASH_OFF_GPU,
            dtypes=("float32", "bfloat16", "float16"), lse="kernel", carries=True),
    Backend("cudnn", "ditax.attention.cudnn:cudnn_attention",
            title="cuDNN flash attention", masks="prefix", ring_local="blockwise", **_CUDA),
    Backend("te", "ditax.attention.te:te_attention", title="TransformerEngine fused attention",
            masks="prefix", ring_local="blockwise", requires="transformer_engine.jax",
            requires_fix="install ditax[gpu] (transformer-engine[jax]) on a CUDA machine, or "
                         "use backend='xla'", **_CUDA),
    Backend("ulysses", _SEQ, opt.SequenceOptions, kind="sequence"),
    Backend("ring", _SEQ, opt.SequenceOptions, kind="sequence"),
    Backend("ulysses_ring", _SEQ, opt.UlyssesRingOptions, kind="sequence"),
)}
assert tuple(BACKENDS) == LOCAL_BACKENDS + PARALLEL_BACKENDS, "registry and config names differ"

_AUTO = {"tpu": "splash", "cuda": "cudnn"}
_AUTO_FALLBACK = {"cuda": "blockwise"}     # when the platform's kernel refuses the inputs
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


def get(name: str) -> Backend:
    """The registry entry for ``name``; ValueError with a suggestion for an unknown name."""
    if name in BACKENDS:
        return BACKENDS[name]
    close = difflib.get_close_matches(str(name), list(BACKENDS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown attention backend {name!r}{hint}; "
                     f"choose one of: auto, {', '.join(BACKENDS)}")


__all__ = ["Backend", "BACKENDS", "auto_backend", "ring_kernel", "get",
           "cudnn_head_dim_limit"]
