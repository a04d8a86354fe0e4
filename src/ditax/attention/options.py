"""Per-backend options: one small frozen dataclass per backend (as the JAX splash kernel has
``BlockSizes``). The fields of a backend's class are exactly the keyword options
``attend(..., backend=name, **options)`` accepts and its kernel function takes; their defaults
are the kernel's defaults (the kernel functions read them from here).

``interpret`` (Pallas kernels): ``None`` means "decide from the target platform"
(:func:`ditax.parallel.platform.platform_of`); plans resolve it to a bool before tracing.

These classes are the one vocabulary of attention options: ``attend(**options)`` and the
``attention.<option>`` config keys are their field names
(:func:`ditax.attention.registry.option_vocabulary`), and an option that none of the kernels
a call runs takes is refused in one line (:func:`ditax.attention.registry.check_options`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from ditax.errors import ConfigError


class Options:
    """Mixin: the options as keyword arguments of the backend's kernel function."""

    def kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names a caller sets (fields marked ``internal`` are filled by ditax)."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal"))


@dataclass(frozen=True)
class NoOptions(Options):
    """``reference``, ``xla``, ``cudnn`` and ``te`` take no options."""


@dataclass(frozen=True)
class BlockwiseOptions(Options):
    block_kv: int = 512                # keys per scan step (Lk is padded to a multiple)


@dataclass(frozen=True)
class FlashOptions(Options):
    # tiles; None = the table's for the target TPU (ditax.attention.tuning, fitted to the
    # lengths), DEFAULT in interpret mode; clipped to the 8-rounded length
    block_q: Optional[int] = None            # query tile
    block_kv: Optional[int] = None           # key tile
    block_kv_compute: Optional[int] = None   # keys per inner forward step (divides block_kv)
    block_q_bwd: Optional[int] = None        # backward tiles (divide the forward ones)
    block_kv_bwd: Optional[int] = None
    interpret: Optional[bool] = None   # Pallas interpret mode; None = from the platform
    # a model's block-sparse self-attention, as splash's (SplashOptions.block_table)
    block_table: Any = field(default=None, metadata={"internal": True})

    DEFAULT = 128                      # the blocks of an interpreted (CPU) run


@dataclass(frozen=True)
class SplashOptions(Options):
    # forward tiles (multiples of 128, clipped to L); None = the table's for the target TPU
    # (ditax.attention.tuning, fitted to the lengths), else 512
    block_q: Optional[int] = None
    block_kv: Optional[int] = None
    block_kv_compute: Optional[int] = None   # inner kv step (divides block_kv)
    block_q_bwd: Optional[int] = None        # backward tiles (default: the forward ones)
    block_kv_bwd: Optional[int] = None
    fused_bwd: bool = False                  # the kernel's fused dq/dkv backward
    interpret: Optional[bool] = None         # None = from the platform (compiled on TPU)
    pad_head_dim: Optional[bool] = None      # zero-pad K to 128; None = when compiled
    # no kv_mask: how padded keys are kept out: auto | duplicate (one unmasked kernel over
    # copied keys, their share removed) | split (whole blocks unmasked + a masked last one)
    # | mask (every block masked); ditax.attention.splash.padded_keys_mode
    padded_keys: str = "auto"
    # a model's block-sparse self-attention: its BlockTable (the tokens tile-major), set by
    # the model per token grid (ditax.attention.sparse.layout); None = dense
    block_table: Any = field(default=None, metadata={"internal": True})
    # a model that appends copies of its first tokens once per forward: how many the keys
    # end with (ditax.attention.splash.token_copies); 0 = none
    copied_keys: int = field(default=0, metadata={"internal": True})

    DEFAULT = 512                            # the blocks of an interpreted (CPU) run


@dataclass(frozen=True)
class SageXlaOptions(Options):
    """``sage_xla``: the tiles (query block, and the scan's key block) and the int8
    quantization blocks inside them."""

    block_q: Optional[int] = None      # query tile (clipped to the length); None: 128
    block_kv: Optional[int] = None     # key tile, the scan's step; None: 128
    quant_block: int = 128             # tokens per int8 scale of Q and of K (at most a tile,
    #                                    dividing it): finer than a tile costs nothing more


@dataclass(frozen=True)
class SageOptions(SageXlaOptions):
    """``sage``: the kernel's tiles (multiples of 32 compiled; None: the chip's row,
    :data:`ditax.attention.tuning.SAGE_TILES`, compiled on a TPU, else 128) and the
    quantization blocks inside them."""

    interpret: Optional[bool] = None   # Pallas interpret mode; None = from the platform


@dataclass(frozen=True)
class SequenceOptions(Options):
    """``ulysses`` and ``ring``: the local kernel and its blocks, the Ulysses output exchange."""

    local: str = "xla"                 # local kernel: reference | xla | blockwise | splash | flash
    out_a2a: str = "flat"              # flat | chunked | shard_major (Ulysses only)
    block_q: Optional[int] = None      # given to a local kernel that takes it; None: the
    block_kv: Optional[int] = None     # kernel's (TPU: the table's for the shard's length)
    interpret: Optional[bool] = None   # given to a Pallas local kernel; None = from platform
    # the local kernel's further options (e.g. splash's fused_bwd) as (name, value) pairs,
    # sorted; attend() / the config set them by their own names, next to these
    local_options: tuple = field(default=(), metadata={"internal": True})


@dataclass(frozen=True)
class UlyssesRingOptions(SequenceOptions):
    ulysses_shards: int = 0            # Ulysses group size U (0 = the whole context axis)


class OptionError(ConfigError, TypeError):
    """An option the backend does not take: a ``TypeError`` (as for a wrong keyword) that the
    command line reports as a bad config (exit 2)."""


def pick(cls: type, values: dict):
    """``cls`` built from the entries of ``values`` that are its fields (None values skipped,
    so the class default applies)."""
    return cls(**{k: values[k] for k in cls.names() if values.get(k) is not None})


__all__ = ["Options", "NoOptions", "BlockwiseOptions", "FlashOptions", "SplashOptions",
           "SageXlaOptions", "SageOptions", "SequenceOptions", "UlyssesRingOptions", "OptionError", "pick"]
