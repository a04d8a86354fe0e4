"""ditax's CUDA program, lowered on this CPU machine: every case Wan hits reaches cuDNN.

Each test traces ditax's real code under ``ditax.target_platform("cuda", (9, 0))`` and lowers
it with ``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` — a real jax lowering
through jax's own cuDNN rules (shapes, dtypes, the even-length rule of the backward) — and
asserts the cuDNN fused-attention custom calls are in the StableHLO. jax asks the local
GPU for its cuDNN version and compute capability while lowering; the ``h200`` fixture answers
for an H200 (sm 9.0, cuDNN 9.10) by patching those probes in jax's private module
``jax._src.cudnn.fused_attention_stablehlo`` — test code only, and
:func:`test_jax_cudnn_probes_are_where_we_patch_them` fails (not skips) if jax moves them.

What this does not show: that cuDNN runs these programs, or their numbers (the padding and
length logic is checked numerically on CPU in ``test_attention_gpu.py``;
``benchmarks/gpu_check.py`` checks the rest on a GPU).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cuda_probes
import ditax
from cuda_probes import BWD, FWD, PROBES, cuda_hlo
from ditax.attention import AttentionUnavailable, attend
from ditax.parallel.mesh import make_mesh

_fa = cuda_probes.fused_attention_module


def test_jax_cudnn_probes_are_where_we_patch_them():
    """The h200 fixture patches these private names; if jax renames or moves them, the
    lowering tests below would test nothing meaningful — fail here, loudly."""
    fa = _fa()
    for name in PROBES:
        assert hasattr(fa, name), f"jax moved {name}; update tests/attention/test_cuda_lowering.py"
    assert "cudnn_get_version" in inspect.getsource(fa.check_cudnn_version)
    src = inspect.getsource(fa.check_is_flash_attention)
    assert "check_compute_capability(" in src and "is_cuda_compute_capability_equal(" in src


@pytest.fixture
def h200():
    with cuda_probes.h200():       # the probes answered for an H200 (tests/refs/cuda_probes.py)
        yield


def assert_cudnn(fn, *args, grad_argnums=(0, 1, 2)):
    """fn lowers for CUDA with cuDNN forward; its gradient with cuDNN forward and backward."""
    fwd = cuda_hlo(fn, *args)
    assert FWD in fwd and BWD not in fwd

    def loss(*a):
        return jnp.sum(jax.tree.leaves(fn(*a))[0].astype(jnp.float32))

    bwd = cuda_hlo(jax.grad(loss, grad_argnums), *args)
    assert FWD in bwd and BWD in bwd
    return fwd, bwd


def bf16(*shape):
    return jnp.zeros(shape, jnp.bfloat16)


def prefix(B, T):
    return jnp.arange(T)[None, :] < jnp.arange(T - B + 1, T + 1)[:, None]


def test_cross_attention_with_a_text_mask(h200):
    q, kv = bf16(2, 100, 4, 64), bf16(2, 77, 4, 64)
    mask = prefix(2, 77)
    _, bwd = assert_cudnn(lambda q, k, v, m: attend(q, k, v, backend="cudnn", kv_mask=m),
                          q, kv, kv, mask)
    assert "tensor<2x1x1x77xbf16>" not in bwd          # no bias: the mask went in as lengths


@pytest.mark.parametrize("Lq,Lk,masked", [(999, 999, False), (999, 999, True), (51, 77, True),
                                          (4095, 513, False)])
def test_odd_lengths(h200, Lq, Lk, masked):
    q, kv = bf16(1, Lq, 2, 128), bf16(1, Lk, 2, 128)
    mask = prefix(1, Lk) if masked else None
    assert_cudnn(lambda q, k, v: attend(q, k, v, backend="cudnn", kv_mask=mask), q, kv, kv)


@pytest.mark.parametrize("out_a2a", ["flat", "chunked"])
def test_ulysses_local_cudnn_context8_51_tokens_per_device(h200, out_a2a):
    """Self-attention: 403 tokens padded to 8·51 (padding as key lengths) through Ulysses;
    cross-attention: 51 queries per device against 77 masked text tokens."""
    mesh = make_mesh({"context": 8})
    x, text, mask = bf16(1, 403, 8, 64), bf16(1, 77, 8, 64), prefix(1, 77)
    opts = dict(backend="ulysses", local="cudnn", mesh=mesh, out_a2a=out_a2a)
    assert_cudnn(lambda q, k, v: attend(q, k, v, **opts), x, x, x)
    assert_cudnn(lambda q, k, v, m: attend(q, k, v, kv_mask=m, **opts), bf16(1, 408, 8, 64),
                 text, text, mask)
    with pytest.raises(ValueError, match="shard_major.*cannot run"):
        cuda_hlo(lambda q: attend(q, q, q, **{**opts, "out_a2a": "shard_major"}), x)


def test_ring_local_cudnn_runs_blockwise_steps(h200, caplog, monkeypatch):
    """No public cuDNN call returns a differentiable float32 lse: the ring steps run
    blockwise (said once), cross-attention stays on cuDNN."""
    from ditax.attention import registry

    monkeypatch.setattr(registry, "_logged", set())   # "once" per process: earlier tests said it
    mesh = make_mesh({"context": 8})
    x = bf16(1, 408, 8, 64)
    with caplog.at_level("WARNING", logger="ditax.attention.registry"):
        hlo = cuda_hlo(lambda q: attend(q, q, q, backend="ring", local="cudnn", mesh=mesh), x)
    assert FWD not in hlo and any("ring steps run local=blockwise" in r.getMessage()
                                  for r in caplog.records)
    text = bf16(1, 77, 8, 64)
    assert FWD in cuda_hlo(lambda q, k: attend(q, k, k, backend="ring", local="cudnn",
                                               mesh=mesh), x, text)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from ditax.demo.folders import write_transformer

    folder = tmp_path_factory.mktemp("tiny") / "transformer"
    write_transformer(folder)
    return folder


def test_transformer_under_a_users_jit_with_text_mask(h200, tiny_folder):
    """``load_transformer(...)`` composes: the loaded model is an argument of the user's own
    jit (parameters as inputs, not constants), forward and gradient lower onto cuDNN."""
    tr = ditax.load_transformer(tiny_folder, dtype="bfloat16", attention="cudnn")
    x, t = jnp.zeros((2, 16, 2, 8, 8), jnp.bfloat16), jnp.ones((2,))
    text, mask = jnp.zeros((2, 16, 64), jnp.bfloat16), prefix(2, 16)

    def forward(tr, x, text, mask):
        return tr(x, t, text, mask)

    fwd, bwd = assert_cudnn(forward, tr, x, text, mask, grad_argnums=(0, 1))
    n_params = len(jax.tree.leaves(tr))
    assert fwd.split("->")[0].count("%arg") >= n_params + 3
    grads = jax.eval_shape(jax.grad(lambda tr: jnp.sum(forward(tr, x, text, mask)
                                                       .astype(jnp.float32))), tr)
    assert type(grads) is type(tr)


def test_training_step_cudnn_fsdp8(h200):
    from ditax.config import load_config
    from ditax.train.step import Trainer

    cfg = load_config("tiny", ["model.dtype=bfloat16", "attention.backend=cudnn",
                               "mesh.fsdp=8", "batch_size=8"])
    mesh = make_mesh(cfg.mesh)
    trainer = Trainer(cfg, mesh)
    sh = trainer.batch_sh
    batch = {"latents": jax.ShapeDtypeStruct((8, 16, 2, 8, 8), jnp.float32,
                                             sharding=sh["latents"]),
             "text": jax.ShapeDtypeStruct((8, 16, 64), jnp.float32, sharding=sh["text"]),
             "text_mask": jax.ShapeDtypeStruct((8, 16), jnp.uint8, sharding=sh["text_mask"])}
    hlo = cuda_hlo(trainer.step, trainer.abstract_state(), batch)
    assert FWD in hlo and BWD in hlo


def test_cudnn_lowering_needs_the_cuda_target(h200):
    """The refusal logic still holds under the patched probes: float32 is refused."""
    q = jnp.zeros((1, 8, 2, 64), jnp.float32)
    with pytest.raises(AttentionUnavailable, match="got float32"):
        cuda_hlo(lambda q: attend(q, q, q, backend="cudnn"), q)
