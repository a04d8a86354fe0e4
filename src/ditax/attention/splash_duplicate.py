"""Splash at a padded key length without a mask: ONE unmasked kernel over keys padded with
copies of real keys, the copies' share removed afterwards, exactly.

Why: the wrapper pads the keys to a block multiple, and JAX's splash kernel applies a mask
(segment ids or a mask function) to every block once it has one. Measured on a TPU v5e at
Wan 2.1 1.3B's 480p shape (12 heads x 128, bf16, blocks 2048 / 4096 / 1024): 0.0420 s with
the 8 padded keys of 32,760 masked against 0.0381 s for 32,768 keys under ``FullMask``.

The trick: pad with ``n = Lk_p - Lk`` copies of the distinct real keys ``0 .. n-1`` (their
keys; their values zero) and run the kernel under ``FullMask`` with ``save_residuals``. With
``s_j = q·k_j`` (q pre-scaled, as the kernel sees it), ``Z = Σ_{j<Lk} exp(s_j)`` and
``D = Σ_{d<n} exp(s_d)`` the kernel returns::

    lse = log(Z + D),    o = Σ_{j<Lk} exp(s_j) v_j / (Z + D)      (the copies' v are 0)

Each copied key is also a real key (``n <= Lk``), so ``D <= Z`` and the copies' share
``R = D / (Z + D) = Σ_d exp(s_d - lse)`` lies in ``[0, 1/2]``; the true attention is::

    o_true = o / (1 - R),    lse_true = lse + log(1 - R)

(zero values for the copies spare the subtraction of ``Σ_d r_d v_d`` that copied values
would need). ``R`` comes from the ``[Lq, N, n]`` scores of the copied keys, in float32.

Error bound. Let the computed ``R̂ = R (1 + ρ)``, ``|ρ| <= ε``, where ``ε`` bounds the
error of ``s_d - lse`` (both are float32 sums of the same rounded operands: the scores an
f32-accumulated dot like the kernel's, the kernel's ``lse = m + log l``) plus the rounding of
``exp`` and of the n-term sum. Then ``1 - R̂ = (1 - R)(1 - ρ R / (1 - R))`` with
``R / (1 - R) <= 1``, so ``1 / (1 - R̂)`` is within a relative ``ε / (1 - ε)`` of
``1 / (1 - R)`` and ``log(1 - R̂)`` within ``ε / (1 - ε)`` of ``log(1 - R)``: the only
subtraction, ``1 - R >= 1/2``, has condition number ``R / (1 - R) <= 1`` (no catastrophic
cancellation). The kernel's own error in ``o`` is scaled by ``1 / (1 - R) <= 2`` together
with ``o`` itself, so relative to ``o_true`` it is unchanged; the division in float32 and
the rounding back to ``o``'s dtype add one rounding (bf16: ``2^-8``). In all,
``|ô_true - o_true| <= |δo| / (1 - R) + (ε + u) |o_true|`` with ``|δo|`` the kernel's error.

The kernel's ``save_residuals`` mode has no VJP: the wrapper makes this the primal of a
``custom_vjp`` whose rules run its masked kernel (:func:`ditax.attention.splash.masked_vjp`),
so gradients and a training step's cost are as before.

Cost beyond the kernel (Wan 480p, bf16, compiled for a v5e deviceless, XLA's cycle
estimates at 1.5 GHz): the kernel's lse is written lane-broadcast (``[N, L, 128]`` float32,
201 MB, in the kernel's shadow) and sliced (one pass, ~0.6 ms); the 8 copies' scores with
their exp-sum are one fusion (~0.18 ms); the correction is one pass over ``o`` (bf16 in,
bf16 out, the cut and the token-major transpose fused: ~0.61 ms, as the plain cut the
masked path pays). Against the masked path: +0.4 ms head-major, +0.8 ms token-major, for
~3.9 ms the unmasked kernel saves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The automatic choice (``padded_keys="auto"``, :func:`ditax.attention.splash.padded_keys_mode`)
# in units of one key column of the kernel (Wan 480p on a v5e: 0.0381 s / 32,768 = 1.16 µs).
#: the masked kernel's extra time over the unmasked one (0.0420 s / 0.0381 s, measured)
MASK_PREMIUM = 0.10
#: the copies' fixed extra passes (the lse slice, the scores' read of q): 0.37 ms by bytes,
#: 0.39 ms (head-major) to 0.78 ms (token-major) by XLA's v5e cycle estimates
DUPLICATE_FIXED = 500
#: each copy: a key column of the kernel plus ~2 of the fused scores (estimate: ~2.2 µs)
COPY_COST = 3
#: most copies "auto" takes: past it the split (:mod:`ditax.attention.splash_split`; ~0.55
#: ms more elementwise passes than the copies, plus its masked tail: ~0.5 ms for 4,096 keys)
#: is cheaper; break-even ~460 copies at Wan 480p. Real video lengths pad a few keys (Wan
#: 480p: 8) or thousands (720p: 2,224).
DUPLICATE_MAX = 256


def duplicate_pays(n: int, Lk_p: int) -> bool:
    """Whether ``n`` copies in ``Lk_p`` keys cost less than masking every block (estimates
    above): from ~5,000 keys on."""
    return DUPLICATE_FIXED + COPY_COST * n < MASK_PREMIUM * Lk_p


def copy_pad(kh, Lk_p: int, Kp: int):
    """Keys ``[B, N, Lk, K]`` padded to ``[B, N, Lk_p, Kp]`` with copies of keys
    ``0 .. Lk_p-Lk-1`` (which must be real: ``Lk_p - Lk <= Lk``), the head dim with zeros."""
    n, Lk = Lk_p - kh.shape[2], kh.shape[2]
    if n > Lk:
        raise ValueError(f"{n} copied keys need as many distinct real keys; there are {Lk}")
    kh = jnp.concatenate([kh, kh[:, :, :n]], axis=2)
    return jnp.pad(kh, ((0, 0), (0, 0), (0, 0), (0, Kp - kh.shape[3])))


def duplicate_forward(qt, kt, vt, *, n: int, cut: tuple[int, int], sizes, interpret: bool):
    """Attention over head-major padded inputs (q ``[B, N, Lq_p, Kp]``, k ``[B, N, Lk_p,
    Kp]`` whose last ``n`` keys copy keys ``0 .. n-1`` (:func:`copy_pad`), v ``[B, N, Lk_p,
    Kp]`` zero there) as if the copies were absent, cut to the real queries and head dim:
    ``(o [B, N, Lq, K]`` in q's dtype, ``lse [B, N, Lq]`` float32); one kernel under
    ``FullMask``."""
    from ditax.attention.splash_kernel import kernel as _kernel
    from ditax.attention.splash_kernel import kernel_precision

    B, N, Lq_p, _ = qt.shape
    Lq, K = cut
    kernel = _kernel(N, Lq_p, kt.shape[2], sizes, interpret, True)

    def one(q, k, v):   # one batch row, cut before the correction (XLA fuses it: one pass)
        o, (lse,) = kernel(q, k, v)
        return remove_copies(o[:, :Lq, :K], lse, q, k[:, k.shape[1] - n:])

    with jax.default_matmul_precision(kernel_precision(qt.dtype)):
        return jax.vmap(one)(qt, kt, vt)


def remove_copies(o, lse, q, kc):
    """The copies' share removed (module docstring): o ``[..., L, K]`` and its lse ``[...,
    Lp]`` (``Lp >= L`` rows: the first L are o's) over keys that include ``kc [..., n, Kp]``
    twice, once with zero values; q ``[..., Lp, Kp]`` as the kernel saw it. → (o in its
    dtype, lse ``[..., L]`` float32) without the copies."""
    from ditax.attention.splash_kernel import kernel_precision

    s = jnp.einsum("...qk,...dk->...qd", q, kc, preferred_element_type=jnp.float32,
                   precision=kernel_precision(q.dtype))                   # [..., Lp, n]
    lse = lse.astype(jnp.float32)
    share = jnp.sum(jnp.exp(s - lse[..., None]), axis=-1)                # R <= 1/2
    L = o.shape[-2]
    keep = 1.0 - share[..., :L]
    o = (o.astype(jnp.float32) * (1.0 / keep)[..., None]).astype(o.dtype)
    return o, lse[..., :L] + jnp.log(keep)


__all__ = ["DUPLICATE_MAX", "duplicate_pays", "copy_pad", "duplicate_forward", "remove_copies"]
