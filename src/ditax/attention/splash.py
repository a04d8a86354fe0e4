"""The Pallas TPU splash-attention kernel (``jax.experimental.pallas.ops.tpu.splash_attention``)
behind the ``attend`` convention.

Why a wrapper: the kernel works on one batch row at a time (``[N, L, K]``), takes no softmax
scale, needs sequence lengths that are block multiples and expresses masking as segment ids.
This module adapts our ``[B, L, N, K]`` + ``kv_mask [B, Lk]`` interface to it:

- batch: ``jax.vmap`` over B (the segment ids differ per batch row);
- scale: q is pre-multiplied by ``scale`` (the kernel computes ``softmax(q·kᵀ)``);
- lengths: Lq/Lk are padded up to the (clipped) block sizes; padded keys get kv segment id 0
  and every query segment id 1, so they are never attended; padded query rows are sliced off;
  without a kv_mask (``padded_keys``, :func:`padded_keys_mode`) the kernel runs unmasked
  instead (it masks every block once it has segment ids): over keys padded with copies of
  real keys whose share is removed afterwards (:mod:`ditax.attention.splash_duplicate`), or
  split into whole blocks and a masked last one (:mod:`ditax.attention.splash_split`);
- kv_mask: masked keys get segment id 0 as well; a batch row whose keys are all masked
  returns zeros (as the reference; the kernel itself must not see an all-masked row, so such
  rows run unmasked and are zeroed afterwards);
- head dim: with ``pad_head_dim`` (default: when compiled, i.e. on TPU, and K is not a
  multiple of 128) q/k/v are zero-padded to a lane multiple; zero columns add nothing to
  ``q·kᵀ`` and the padded output columns are sliced off.

Compiled when the target platform (:func:`ditax.parallel.platform.platform_of`) is TPU; on
CPU the kernel runs in Pallas interpret mode (slow, exact: for tests); on GPUs it is refused
(:class:`~ditax.errors.AttentionUnavailable`: use ``cudnn`` / ``te``) unless
``interpret=True`` is asked for explicitly.
Gradients come from the kernel's own VJP. ``return_lse`` is forward-only: the kernel's
residual-saving mode has no VJP (differentiating it raises ``NO_LSE_GRADIENT`` in one line:
a ring trains with ``local="flash"``). The kernels' matmul precision is pinned per dtype
(:func:`kernel_precision`), forward and backward, so a global
``jax_default_matmul_precision="highest"`` neither breaks the TPU compile nor turns bf16
products into multi-pass float32 ones.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ditax.attention.blocks import LANES, round_up
from ditax.attention.options import SplashOptions as _O
from ditax.attention.registry import BACKENDS
from ditax.attention.splash_kernel import kernel as _kernel
from ditax.attention.splash_kernel import forward_only, pinned_precision
from ditax.parallel.platform import platform_of

#: why a splash call with ``return_lse`` (a ring step's partial) cannot be differentiated
NO_LSE_GRADIENT = ("attention: splash with return_lse (the log-sum-exp a ring step merges) has "
                   "no gradient (the kernel's residual-saving mode has no VJP); train a ring "
                   "with local='flash', or use backend='splash' / 'ulysses'")


#: the tile keywords of :func:`splash_attention`
TILES = ("block_q", "block_kv", "block_kv_compute", "block_q_bwd", "block_kv_bwd")


def splash_attention(q, k, v, *, kv_mask=None, scale=None, fused_bwd: bool = _O.fused_bwd,
                     interpret: bool | None = None, pad_head_dim: bool | None = None,
                     return_lse: bool = False, head_major: bool = False, block_table=None,
                     padded_keys: str = _O.padded_keys, copied_keys: int = 0,
                     **tiles: int | None):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` → ``[B, Lq, N, K]``;
    with ``head_major`` q/k/v and the output are ``[B, N, L, K]``, the kernel's own layout
    (no transposes around it).

    Args:
      tiles: ``block_q``, ``block_kv``, ``block_kv_compute``, ``block_q_bwd``,
        ``block_kv_bwd`` (ints or None; no other keyword).
        block_q, block_kv: forward tile sizes (clipped to the 128-rounded sequence lengths;
        multiples of 128). block_kv_compute: inner kv step (divides block_kv).
        block_q_bwd / block_kv_bwd: backward tiles. Unset ones: compiled on a TPU the
        table's (:func:`ditax.attention.tuning.splash_blocks`, fitted to the lengths; a given
        forward block also sets its unset backward one); in interpret mode 512, block_kv
        and the forward ones.
      fused_bwd: use the kernel's fused dq/dkv backward.
      interpret: run Pallas in interpret mode; None → on CPU (compiled on TPU, refused on
        GPUs).
      pad_head_dim: zero-pad K to a multiple of 128; None → when compiled and needed.
      return_lse: also return the float32 log-sum-exp ``[B, N, Lq]`` (forward only).
      block_table: a :class:`~ditax.attention.sparse.masks.BlockTable` (the tokens in
        tile-major order): the kernel skips every block the table masks whole (block-sparse
        attention); None: every block (dense).
      padded_keys: without a kv_mask (and block table), how keys padded to a block
        multiple are kept out — the kernel applies a mask to every block once it has one
        (TPU v5e, Wan's 32,760 tokens: 0.0420 s masked vs 0.0381 s unpadded under
        FullMask): "auto" (default), "duplicate" (one unmasked kernel over keys padded with
        copies of real keys, their share removed exactly:
        :mod:`ditax.attention.splash_duplicate`), "split" (whole blocks unmasked, the last
        one masked, merged: :mod:`ditax.attention.splash_split`) or "mask" (segment ids,
        every block masked). :func:`padded_keys_mode` chooses; unpadded keys run unmasked
        unless "mask". Gradients: the masked kernel's (unpadded: the unmasked kernel's).
      copied_keys: the last ``copied_keys`` of the Lk keys are copies of keys ``0 ..
        copied_keys-1`` that the caller appended (a model that pads its tokens once per
        forward, :func:`token_copies`): they are kept out exactly as the "duplicate" mode's
        copies (their values zeroed here), or masked with a kv_mask or block table or where
        the blocks do not divide Lk.
        Their queries are answered like the others (the caller drops those rows).
    """
    try:
        from jax.experimental.pallas.ops.tpu import splash_attention as sa
    except ImportError as e:  # pragma: no cover - depends on the installed jax
        from ditax.errors import AttentionUnavailable

        raise AttentionUnavailable(
            f"attention backend 'splash' needs jax.experimental.pallas.ops.tpu.splash_attention"
            f" ({e}); upgrade jax or use backend='xla'") from None

    platform = platform_of()
    if interpret is None:
        interpret = BACKENDS["splash"].default_interpret(platform)
    interpret = bool(interpret)
    BACKENDS["splash"].require(platform, interpret=interpret)   # GPUs: refused, not interpreted
    if head_major:
        B, N, Lq, K = q.shape
        Lk = k.shape[2]
    else:
        B, Lq, N, K = q.shape
        Lk = k.shape[1]
    scale = float(K ** -0.5 if scale is None else scale)
    unknown = sorted(set(tiles) - set(TILES))
    if unknown:
        raise TypeError(f"splash_attention got unknown keyword {unknown[0]!r}; its tiles are "
                        f"{', '.join(TILES)}")
    bq, bkv, bkv_c, bq_b, bkv_b = blocks(Lq, Lk, interpret, platform.device_kind, tiles)
    Lq_p, Lk_p = round_up(Lq, max(bq, bq_b)), round_up(Lk, max(bkv, bkv_b))
    if copied_keys:     # the caller's own copies (their values zeroed: the duplicate mode's)
        if not 0 < copied_keys < Lk:
            raise ValueError(f"copied_keys={copied_keys} must be fewer than the {Lk} keys")
        Lk = Lk - copied_keys
        real = jnp.arange(Lk + copied_keys) < Lk
        v = jnp.where(real[:, None] if head_major else real[:, None, None], v,
                      jnp.zeros((), v.dtype))
        if (Lk_p != Lk + copied_keys or copied_keys > Lk or kv_mask is not None
                or block_table is not None):     # masked instead (a mask, or blocks that
            real = jnp.broadcast_to(real, (B, Lk + copied_keys))   # do not fit)
            kv_mask = real if kv_mask is None else kv_mask.astype(bool) & real
            Lk, copied_keys = Lk + copied_keys, 0

    pad_head_dim = (not interpret and K % LANES != 0) if pad_head_dim is None else bool(
        pad_head_dim)
    Kp = round_up(K, LANES) if pad_head_dim else K

    mode = ("duplicate" if copied_keys
            else padded_keys_mode(padded_keys, Lk, Lk_p, bkv, kv_mask, block_table))
    # [B, L, N, K] -> [B, N, L, K], pre-scaled q, padded L (and K).
    hm = (lambda x: x) if head_major else (lambda x: jnp.swapaxes(x, 1, 2))  # noqa: E731
    # scaled after padding: one pass over q (scaled first, XLA wrote it out twice; v5e)
    qt = _pad(hm(q), Lq_p, Kp)
    if scale != 1.0:    # 1.0: q carries the scale already (ditax.nn.head_projection)
        qt = (qt.astype(jnp.float32) * scale).astype(q.dtype)
    vt = _pad(hm(v), Lk_p, Kp)
    if mode == "duplicate" and copied_keys:     # the copies are there already
        kt = _pad(hm(k), Lk_p, Kp)
    elif mode == "duplicate":
        from ditax.attention.splash_duplicate import copy_pad

        kt = copy_pad(hm(k), Lk_p, Kp)
    else:
        kt = _pad(hm(k), Lk_p, Kp)

    sizes = sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv_c,
                          block_q_dkv=bq_b, block_kv_dkv=bkv_b, block_kv_dkv_compute=bkv_b,
                          block_q_dq=None if fused_bwd else bq_b,
                          block_kv_dq=None if fused_bwd else bkv_b,
                          use_fused_bwd_kernel=bool(fused_bwd))
    if mode != "mask":    # no kv_mask: the unmasked kernel, with the padded keys handled
        if mode == "full":          # nothing padded: its own VJP
            res = _segmented(qt, kt, vt, None, None, sizes, interpret, bool(return_lse))
            res = (res[0][:, :, :Lq, :K], res[1][:, :, :Lq]) if return_lse else res[
                :, :, :Lq, :K]
        else:                       # the output cut inside: XLA fuses the cut
            res = masked_vjp(_padded_primal(mode, Lk, Lk_p, bkv, (Lq, K), sizes, interpret),
                             _masked(Lk, (Lq, K), sizes, interpret), qt, kt, vt,
                             bool(return_lse))
        o = hm(res[0] if return_lse else res).astype(q.dtype)
        return (o, res[1].astype(jnp.float32)) if return_lse else o

    valid = jnp.ones((B, Lk), bool) if kv_mask is None else kv_mask.astype(bool)
    any_key = jnp.any(valid, axis=1)                                     # [B]
    valid = jnp.where(any_key[:, None], valid, True)   # all-masked rows run unmasked, zeroed below
    kv_seg = jnp.pad(valid.astype(jnp.int32), ((0, 0), (0, Lk_p - Lk)))  # padded keys: 0
    q_seg = jnp.ones((B, Lq_p), jnp.int32)

    res = _segmented(qt, kt, vt, q_seg, kv_seg, sizes, interpret, bool(return_lse), block_table)
    o, lse = res if return_lse else (res, None)
    o = hm(o[:, :, :Lq, :K]).astype(q.dtype)               # [B, Lq, N, K] (or head-major)
    o = jnp.where(any_key[:, None, None, None], o, jnp.zeros_like(o))
    if not return_lse:
        return o
    lse = jnp.where(any_key[:, None, None], lse[:, :, :Lq].astype(jnp.float32), -jnp.inf)
    return o, lse


def blocks(Lq: int, Lk: int, interpret: bool, device_kind: str, tiles: dict):
    """``(block_q, block_kv, block_kv_compute, block_q_bwd, block_kv_bwd)`` of one call:
    the given ``tiles``, the rest the table's on a TPU (:func:`ditax.attention.tuning.
    splash_blocks`) or 512 interpreted, each clipped to the 128-rounded lengths."""
    given = {name: tiles.get(name) for name in TILES}
    if not interpret:
        from ditax.attention.tuning import splash_blocks

        given = splash_blocks(Lq, Lk, device_kind, given)
    block_q, block_kv = given["block_q"] or _O.DEFAULT, given["block_kv"] or _O.DEFAULT
    bq = _clip_block("block_q", block_q, Lq)
    bkv = _clip_block("block_kv", block_kv, Lk)
    bkv_c = bkv if given["block_kv_compute"] is None else _clip_block(
        "block_kv_compute", given["block_kv_compute"], Lk)
    if bkv % bkv_c:
        raise ValueError(f"block_kv_compute={bkv_c} must divide block_kv={bkv} "
                         f"(both after clipping to the sequence length {Lk})")
    bq_b = bq if given["block_q_bwd"] is None else _clip_block("block_q_bwd",
                                                               given["block_q_bwd"], Lq)
    bkv_b = bkv if given["block_kv_bwd"] is None else _clip_block("block_kv_bwd",
                                                                  given["block_kv_bwd"], Lk)
    Lq_p, Lk_p = round_up(Lq, max(bq, bq_b)), round_up(Lk, max(bkv, bkv_b))
    if Lq_p % bq or Lq_p % bq_b or Lk_p % bkv or Lk_p % bkv_b:
        raise ValueError(f"forward and backward blocks must nest: block_q={bq}, "
                         f"block_q_bwd={bq_b}, block_kv={bkv}, block_kv_bwd={bkv_b}; "
                         f"use powers of two times 128")
    return bq, bkv, bkv_c, bq_b, bkv_b


def token_copies(L: int, options, platform) -> int:
    """How many copies of its first tokens a model may append to its ``L`` tokens once per
    forward, so that splash self-attention (``options``, on ``platform``) runs on a whole
    number of its blocks with no padding of q, k and v in every layer (``copied_keys``;
    measured on a v5e at Wan 1.3B 480p: four pad passes, ~37 ms a forward): the padding
    the kernel would add, when its blocks at the padded length divide it and the keys'
    padding would run as copies anyway (:func:`padded_keys_mode` "duplicate"); else 0."""
    interpret = options.interpret
    if interpret is None:
        interpret = BACKENDS["splash"].default_interpret(platform)
    tiles = {t: getattr(options, t) for t in TILES}
    kind = platform.device_kind
    bq, bkv, _, bq_b, bkv_b = blocks(L, L, bool(interpret), kind, tiles)
    Lp = round_up(L, max(bq, bkv, bq_b, bkv_b))
    if Lp == L or options.block_table is not None:
        return 0
    bq, bkv, _, bq_b, bkv_b = blocks(Lp, Lp, bool(interpret), kind, tiles)
    if any(Lp % b for b in (bq, bkv, bq_b, bkv_b)):
        return 0
    mode = padded_keys_mode(options.padded_keys, L, Lp, bkv, None, None)
    return Lp - L if mode == "duplicate" else 0


def padded_keys_mode(mode: str, Lk: int, Lk_p: int, block_kv: int, kv_mask,
                     block_table) -> str:
    """How the wrapper runs keys padded from ``Lk`` to ``Lk_p`` without a ``kv_mask``:

    - ``"mask"``: segment ids mask the padded keys (the kernel then masks every block);
      always with a ``kv_mask`` or a block table, and when asked;
    - ``"full"``: nothing padded (and no mask): the kernel under ``FullMask``, no segment
      ids, its own VJP (any mode but ``"mask"``);
    - ``"duplicate"``: one ``FullMask`` kernel over keys padded with copies of real keys,
      their share removed (:mod:`ditax.attention.splash_duplicate`); needs
      ``Lk_p - Lk <= Lk``; ``"auto"`` takes it up to
      :data:`~ditax.attention.splash_duplicate.DUPLICATE_MAX` copies where it costs less
      than masking (:func:`~ditax.attention.splash_duplicate.duplicate_pays`: from ~5,000
      keys), else masks;
    - ``"split"``: the whole ``block_kv`` key blocks unmasked, the last one masked, merged
      (:mod:`ditax.attention.splash_split`); needs a whole block; ``"auto"`` past
      ``DUPLICATE_MAX`` copies.

    An asked-for mode that cannot apply to these lengths falls back to ``"mask"`` (all
    modes are exact; the option is a per-model preference applied to calls of many
    lengths)."""
    from ditax.attention.config import PADDED_KEYS_MODES
    from ditax.attention.splash_duplicate import DUPLICATE_MAX, duplicate_pays

    if mode not in PADDED_KEYS_MODES:
        raise ValueError(f"padded_keys={mode!r} is not one of {', '.join(PADDED_KEYS_MODES)}")
    n = Lk_p - Lk
    if mode == "mask" or kv_mask is not None or block_table is not None:
        return "mask"
    if n == 0:
        return "full"
    split = Lk >= block_kv
    if mode == "auto" and n <= min(DUPLICATE_MAX, Lk):
        mode = "duplicate" if duplicate_pays(n, Lk_p) else "mask"
    elif mode == "auto":
        mode = "split"
    if mode == "duplicate" and n <= Lk or mode == "split" and split:
        return mode
    return "mask"


def split_point(Lk: int, block_kv: int) -> int:
    """Where the keys split (:mod:`ditax.attention.splash_split`): ``Lk`` rounded down to
    ``block_kv``."""
    return Lk // block_kv * block_kv


def masked_vjp(primal, masked, qt, kt, vt, return_lse: bool):
    """``primal(qt, kt, vt) -> (o, lse)`` (a forward without a VJP of its own) as the primal
    of a ``custom_vjp`` whose rules are ``masked``'s (the wrapper's masked kernel): its
    forward's value, the masked kernel's gradients. With ``return_lse`` forward-only, as
    the kernel's residual-saving mode."""
    if return_lse:
        return forward_only(primal, NO_LSE_GRADIENT)(qt, kt, vt)

    @jax.custom_vjp
    def run(qt, kt, vt):
        return primal(qt, kt, vt)[0]

    def fwd(qt, kt, vt):
        return jax.vjp(masked, qt, kt, vt)

    def bwd(vjp, g):
        return vjp(g)

    run.defvjp(fwd, bwd)
    return run(qt, kt, vt)


def _padded_primal(mode: str, Lk: int, Lk_p: int, block_kv: int, cut: tuple[int, int], sizes,
                   interpret: bool):
    """The forward of a padded-keys ``mode``: head-major padded inputs → ``(o [B, N, Lq,
    K], lse [B, N, Lq])``, cut to ``(Lq, K) = cut``."""
    if mode == "split":
        from ditax.attention.splash_split import split_forward

        return functools.partial(split_forward, Lk=Lk, P=split_point(Lk, block_kv), cut=cut,
                                 sizes=sizes, interpret=interpret)
    from ditax.attention.splash_duplicate import duplicate_forward

    return functools.partial(duplicate_forward, n=Lk_p - Lk, cut=cut, sizes=sizes,
                             interpret=interpret)


def _masked(Lk: int, cut: tuple[int, int], sizes, interpret: bool):
    """The wrapper's masked kernel over head-major padded inputs (keys past ``Lk`` masked by
    segment ids, whatever they hold), its output cut to ``(Lq, K)``: the gradient of the
    unmasked paths."""
    def masked(qt, kt, vt):
        B, _, Lq_p, _ = qt.shape
        kv_seg = jnp.asarray(np.arange(kt.shape[2]) < Lk, jnp.int32)
        o = _segmented(qt, kt, vt, jnp.ones((B, Lq_p), jnp.int32),
                       jnp.broadcast_to(kv_seg, (B, kt.shape[2])), sizes, interpret, False)
        return o[:, :, :cut[0], :cut[1]]

    return masked


def _segmented(qt, kt, vt, q_seg, kv_seg, sizes, interpret: bool, return_lse: bool,
               block_table=None):
    """The kernel over head-major padded ``[B, N, L, K]`` inputs with segment ids ``[B, L]``
    (batch vmapped, precision pinned): o, or ``(o, lse [B, N, Lq])`` with ``return_lse``."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    _, N, Lq_p, _ = qt.shape
    kernel = _kernel(N, Lq_p, kt.shape[2], sizes, interpret, return_lse, block_table)

    def one(q_b, k_b, v_b, *seg):
        ids = sa.SegmentIds(q=seg[0], kv=seg[1]) if seg else None
        return kernel(q_b, k_b, v_b, segment_ids=ids)

    seg = () if q_seg is None else (q_seg, kv_seg)
    run = pinned_precision(one, qt.dtype)
    run = forward_only(run, NO_LSE_GRADIENT) if return_lse else run
    res = jax.vmap(run)(qt, kt, vt, *seg)
    return (res[0], res[1][0]) if return_lse else res


def _clip_block(name: str, block, length: int) -> int:
    if not isinstance(block, int) or block < LANES or block % LANES:
        raise ValueError(f"{name}={block!r} must be a positive multiple of {LANES} "
                         f"(e.g. 512)")
    return min(block, round_up(length, LANES))


def _pad(x, L: int, K: int):
    """Zero-pad ``[B, N, l, k]`` to ``[B, N, L, K]``."""
    return jnp.pad(x, ((0, 0), (0, 0), (0, L - x.shape[2]), (0, K - x.shape[3])))
