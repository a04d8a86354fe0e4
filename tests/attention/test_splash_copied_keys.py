"""Splash over keys whose last ``n`` copy the first ``n`` (``copied_keys``: a model that pads
its tokens once per forward, :func:`ditax.attention.splash.token_copies`) equals attention
over the real keys alone — forward, gradients, with a key mask, both layouts — and the
choice of how many copies a model appends."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.options import SplashOptions
from ditax.attention.splash import splash_attention, token_copies
from ditax.parallel.platform import platform_of

L, N, K = 1000, 2, 32           # 1,000 real tokens: 1,024 at blocks of 128, 24 copies
COPIES = 24
BLOCKS = dict(block_q=128, block_kv=128, interpret=True)


def _reference(q, k, v, kv_mask=None):
    s = jnp.einsum("blnk,btnk->bnlt", q, k, precision="highest") * K ** -0.5
    if kv_mask is not None:
        s = jnp.where(kv_mask[:, None, None, :], s, -jnp.inf)
    return jnp.einsum("bnlt,btnk->blnk", jax.nn.softmax(s, -1), v, precision="highest")


def _with_copies(x, garbage=None):
    tail = x[:, :COPIES] if garbage is None else garbage
    return jnp.concatenate([x, tail], axis=1)


@pytest.fixture(scope="module")
def qkv():
    ks = jax.random.split(jax.random.key(7), 4)
    q, k, v = (jax.random.normal(kk, (1, L, N, K), jnp.float32) for kk in ks[:3])
    return q, k, v, jax.random.normal(ks[3], (1, COPIES, N, K), jnp.float32) * 50


@pytest.mark.parametrize("head_major", [False, True])
def test_copied_keys_equal_attention_over_the_real_keys(qkv, head_major):
    """The copies' values are whatever the caller computed (here large noise): zeroed and
    their share removed, the real rows equal attention over the 1,000 real keys."""
    q, k, v, junk = qkv
    qp, kp, vp = _with_copies(q), _with_copies(k), _with_copies(v, junk)
    t = (lambda x: jnp.swapaxes(x, 1, 2)) if head_major else (lambda x: x)  # noqa: E731
    out = splash_attention(t(qp), t(kp), t(vp), copied_keys=COPIES, head_major=head_major,
                           **BLOCKS)
    out = t(out)
    assert out.shape == (1, L + COPIES, N, K)
    ref = _reference(q, k, v)
    np.testing.assert_allclose(np.asarray(out[:, :L]), np.asarray(ref), atol=2e-5)
    # the copies' own queries are answered too (rows the model drops)
    np.testing.assert_allclose(np.asarray(out[:, L:]), np.asarray(ref[:, :COPIES]), atol=2e-5)
    # without copied_keys the copies would count twice: a visible difference
    plain = splash_attention(qp, kp, vp.at[:, L:].set(0), **BLOCKS)
    assert float(jnp.abs(plain[:, :L] - ref).max()) > 1e-3


def test_copied_keys_gradients_equal_the_real_keys(qkv):
    """Through the copy (as a model makes it: the copied rows are the first rows again) the
    gradients of q, k, v equal attention's over the real tokens."""
    q, k, v, _ = qkv
    w = jax.random.normal(jax.random.key(3), (1, L, N, K))

    def ours(q, k, v):
        o = splash_attention(_with_copies(q), _with_copies(k), _with_copies(v),
                             copied_keys=COPIES, **BLOCKS)
        return jnp.sum(o[:, :L] * w)

    got = jax.grad(ours, argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda q, k, v: jnp.sum(_reference(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=5e-5)


def test_copied_keys_with_a_key_mask_fold_into_it(qkv):
    """A block-causal call passes a key mask: the copies are masked with it."""
    q, k, v, junk = qkv
    mask = jnp.arange(L + COPIES)[None] < 700            # the first 700 keys (and copies)
    out = splash_attention(_with_copies(q), _with_copies(k), _with_copies(v, junk),
                           kv_mask=mask, copied_keys=COPIES, **BLOCKS)
    ref = _reference(q, k, v, kv_mask=mask[:, :L])
    np.testing.assert_allclose(np.asarray(out[:, :L]), np.asarray(ref), atol=2e-5)


def test_token_copies_only_where_the_keys_would_be_copied_anyway():
    cpu = platform_of()
    opts = SplashOptions(**BLOCKS, padded_keys="duplicate")
    assert token_copies(1000, opts, cpu) == 24
    assert token_copies(1024, opts, cpu) == 0                       # a whole number of blocks
    assert token_copies(1000, SplashOptions(**BLOCKS, padded_keys="mask"), cpu) == 0
    # "auto" takes copies where they pay (from ~5,000 keys; interpreted blocks: 512)
    auto = SplashOptions(interpret=True)
    assert token_copies(1000, auto, cpu) == 0
    assert token_copies(32760, auto, cpu) == 8                      # Wan 1.3B 480p
    assert token_copies(32760, SplashOptions(interpret=True, block_table=object()), cpu) == 0


def test_token_copies_on_a_v5e_with_the_tables_blocks(monkeypatch):
    """Compiled for a v5e (the table's blocks): Wan 1.3B 480p's 32,760 tokens take 8
    copies; 720p's 75,600 take 176 under the default scoped VMEM (75,776 = 37 key blocks of
    2,048), none under the limit ditax commands raise (blocks of 4,096: 2,224 keys, past
    the copies' limit) — as many keys as the kernel itself pads, where copies pay."""
    import ditax
    from ditax.tpu_env import FLAG, RAISED_SCOPED_MIB

    with ditax.target_platform("tpu", device_kind="TPU v5 lite"):
        tpu = platform_of()
        monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
        assert token_copies(32760, SplashOptions(), tpu) == 8
        assert token_copies(75600, SplashOptions(), tpu) == 176
        monkeypatch.setenv("LIBTPU_INIT_ARGS", f"{FLAG}={RAISED_SCOPED_MIB['v5e'] * 1024}")
        assert token_copies(32760, SplashOptions(), tpu) == 8
        assert token_copies(75600, SplashOptions(), tpu) == 0
