"""One-shot GPU check for a lent H200: one JSON object per line, never stops at a failure.

    PYTHONPATH=src python benchmarks/gpu_check.py          # on the GPU: ≤ 6 minutes
    PYTHONPATH=src python benchmarks/gpu_check.py --dry    # CPU, tiny shapes, xla stands in

Each line is ``{"bench": "gpu_check", "case", "metric", "value", "unit", ...}``; accuracy lines
carry ``"ok"``; a failing check prints ``metric: "error"`` and the script goes on; a check the
time budget (``--budget`` s, default 300; a watchdog ends the process at budget + 40 s) can no
longer fit prints ``"skipped"``. The last line is the summary. Checks, most important first:

1. ``versions``: python, jax, device kind, compute capability, cuDNN, torch, TE.
2. ``matmul_bf16``: the bf16 matmul TFLOP/s ceiling (8192³).
3. ``cudnn_vs_reference``: ``attend(backend="cudnn")`` vs the float32 reference, forward and
   dq/dk/dv: even and odd L, K 64/128, text 77/512 with prefix masks, context padding.
4. ``cudnn_tflops``: fwd and fwd+bwd at Wan 1.3B 480p (L=32760, N=12, K=128), the 14B 720p
   per-device self-attention under 8-way Ulysses (L=75600, N=5) and its per-device text
   cross-attention (9450 queries, 512 keys, N=40).
5. ``wan2``: a 2-layer Wan at 1.3B width, cudnn in bf16 and xla in bf16, each against xla in
   float32 on the same weights: output and the whole parameter gradient (global-norm relative
   error), with and without a text mask; cudnn passes when it is as close to float32 as xla's
   own bf16 (the worst single leaf is reported, not judged: see ``leaf_errors``).
6. ``te``: te vs cudnn when ``transformer_engine.jax`` imports, else one line saying so.
7. ``torch``: ditax cudnn vs torch SDPA attention at the 1.3B shape on the same card; and
   when diffusers imports, its 2-layer 1.3B-width ``WanTransformer3DModel`` vs ditax.
8. ``wan_full``: Wan 2.1 1.3B at full depth, one forward at 480p × 81 frames, ditax (cudnn)
   vs diffusers (torch SDPA) when it imports.
9. ``train_step``: a Wan 2.1 1.3B training step at 480p × 81 frames, batch 1 (remat full,
   AdamW): step time, tokens/s, model TFLOP/s and MFU (the train loop's estimators).

``--only wan2,wan_full`` runs a subset (``versions`` always runs).

In ``--dry`` mode the cuDNN wrapper runs with jax's ``xla`` implementation and models use
``backend="xla"`` (CI runs it: it checks the script, not cuDNN). The model checks need
ditax's model dependencies (flax, optax, pydantic, pyyaml, safetensors); where they are
missing the line names the module (carry them, e.g. ``pip install --no-deps --target
.gpu_vendor flax optax ...`` for the device's Python, and add it to PYTHONPATH).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")   # leave room for torch

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from attention import median_time  # noqa: E402  (benchmarks/attention.py, this folder)

BENCH = "gpu_check"


class Run:
    """Emits lines, keeps the time budget, turns exceptions into ``error`` lines."""

    def __init__(self, dry: bool, budget: float):
        self.dry, self.budget, self.t0 = dry, budget, time.perf_counter()
        self.failed = self.lines = 0

    def emit(self, case, metric, value=None, unit="", **extra):
        self.lines += 1
        if extra.get("ok") is False:
            self.failed += 1
        print(json.dumps({"bench": BENCH, "case": case, "metric": metric, "value": value,
                          "unit": unit, **extra}, default=str), flush=True)

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def check(self, case, fn, need_s: float = 10.0):
        if self.left() < need_s:
            return self.emit(case, "skipped", reason=f"{max(self.left(), 0):.0f} s of the "
                                                     f"{self.budget:.0f} s budget left")
        try:
            fn(self, case)
        except Exception as e:  # noqa: BLE001 - report and go on
            self.failed += 1
            self.emit(case, "error", error=f"{type(e).__name__}: {e}"[:600],
                      where=traceback.format_exc(limit=-3)[-600:])


def timed(fn, *args, repeats=5):
    """Median seconds of ``fn(*args)`` after a compile + warm-up call."""
    return median_time(fn, args, repeats)


def rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float32), np.asarray(ref, np.float32)
    return float(np.max(np.abs(x - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def torch_timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` (which synchronises the device) after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def normal(key, shape, dtype=jnp.bfloat16):
    return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32).astype(dtype)


def prefix(lengths, Lk):
    return jnp.arange(Lk)[None, :] < jnp.asarray(lengths)[:, None]


def kernel(run):
    """The cuDNN attention (dry: the same wrapper with jax's xla implementation)."""
    if run.dry:
        from ditax.attention.cudnn import length_masked_attention

        return functools.partial(length_masked_attention, implementation="xla")
    from ditax.attention import attend

    return functools.partial(attend, backend="cudnn")


# ------------------------------------------------------------------------------- checks


def versions(run, case):
    dev = jax.devices()[0]
    info = dict(python=platform.python_version(), jax=jax.__version__,
                device=getattr(dev, "device_kind", dev.platform), devices=jax.device_count(),
                compute_capability=getattr(dev, "compute_capability", None))
    try:
        from jax._src.lib import cuda_versions   # private: informational only
        info["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception as e:  # noqa: BLE001
        info["cudnn"] = f"unknown ({type(e).__name__})"
    for mod in ("torch", "transformers", "diffusers", "flax", "transformer_engine"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            info[mod] = f"absent ({type(e).__name__})"
    if not isinstance(info["torch"], str) or not info["torch"].startswith("absent"):
        import torch
        info["torch_cuda"] = torch.cuda.is_available()
    run.emit(case, "versions", dev.platform, **info)


def matmul(run, case):
    n = 256 if run.dry else 8192
    a, b = normal(0, (n, n)), normal(1, (n, n))
    t = timed(jax.jit(jnp.matmul), a, b, repeats=3 if run.dry else 10)
    run.emit(case, "tflops", 2 * n ** 3 / t / 1e12, "TFLOP/s", n=n, seconds=t)


REF_CASES = {   # name: (B, Lq, Lk, N, K, key lengths or None)
    "self_L1024_K128": (2, 1024, 1024, 8, 128, None),
    "self_L999_K64_padded": (2, 999, 999, 8, 64, (999, 901)),
    "cross_L1024_T77_K128": (2, 1024, 77, 8, 128, (77, 12)),
    "cross_L1023_T512_K64": (2, 1023, 512, 8, 64, (512, 77)),
    "self_L4095_K128_padded": (1, 4095, 4095, 4, 128, (4089,)),
}
DRY_REF_CASES = {
    "self_L64_K128": (2, 64, 64, 2, 128, None),
    "self_L31_K64_padded": (2, 31, 31, 2, 64, (31, 25)),
    "cross_L33_T13_K64": (2, 33, 13, 2, 64, (13, 5)),
}


def vs_reference(run, case):
    from ditax.attention.reference import reference_attention

    attn = kernel(run)
    for name, (B, Lq, Lk, N, K, lens) in (DRY_REF_CASES if run.dry else REF_CASES).items():
        q, k, v = normal(1, (B, Lq, N, K)), normal(2, (B, Lk, N, K)), normal(3, (B, Lk, N, K))
        ct = normal(4, (B, Lq, N, K), jnp.float32)
        mask = None if lens is None else prefix(lens, Lk)

        def loss(f, q, k, v):
            return jnp.sum(f(q, k, v, kv_mask=mask).astype(jnp.float32) * ct)

        def ref(q, k, v, kv_mask):
            f32 = [x.astype(jnp.float32) for x in (q, k, v)]
            return reference_attention(*f32, kv_mask=kv_mask)

        out = jax.jit(lambda q, k, v: attn(q, k, v, kv_mask=mask))(q, k, v)
        err = rel_err(out, jax.jit(lambda q, k, v: ref(q, k, v, mask))(q, k, v))
        run.emit(case, "fwd_rel_err", err, "", shape=name, ok=err <= 2e-2)
        g = jax.jit(jax.grad(functools.partial(loss, attn), (0, 1, 2)))(q, k, v)
        g_ref = jax.jit(jax.grad(functools.partial(loss, ref), (0, 1, 2)))(q, k, v)
        for n, a, b in zip(("dq", "dk", "dv"), g, g_ref):
            e = rel_err(a, b)
            run.emit(case, f"{n}_rel_err", e, "", shape=name, ok=e <= 5e-2)


SPEED_CASES = {
    "wan1.3b_480p_self": (1, 32760, 32760, 12, 128),
    "wan14b_720p_ulysses8_self": (1, 75600, 75600, 5, 128),
    "wan14b_720p_ulysses8_cross": (1, 9450, 512, 40, 128),
}


def speed(run, case):
    attn = kernel(run)
    cases = {"dry_self": (1, 128, 128, 2, 64)} if run.dry else SPEED_CASES
    for name, (B, Lq, Lk, N, K) in cases.items():
        if run.left() < 20:
            return run.emit(case, "skipped", shape=name, reason="time budget")
        q, k, v = normal(1, (B, Lq, N, K)), normal(2, (B, Lk, N, K)), normal(3, (B, Lk, N, K))
        flops = 4.0 * B * N * Lq * Lk * K
        fwd = jax.jit(lambda q, k, v: attn(q, k, v))
        grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32)),
                                (0, 1, 2)))
        for what, fn, f in (("fwd", fwd, flops), ("fwdbwd", grad, 3.5 * flops)):
            t = timed(fn, q, k, v, repeats=2 if run.dry else 5)
            run.emit(case, f"{what}_tflops", f / t / 1e12, "TFLOP/s", shape=name, seconds=t)


def wan_config(run, layers):
    from ditax.config import load_config

    if run.dry:     # one layer: the script's code is the same for any depth
        return load_config("tiny", ["model.dtype=bfloat16", "model.param_dtype=bfloat16",
                                    "model.num_layers=1"]).model
    return load_config("wan2.1-t2v-1.3b", [f"model.num_layers={layers}"]).model


def leaf_errors(g, g_ref):
    """Gradient error against the reference: relative error of the whole gradient (global
    norms) and the leaf with the largest max-abs error relative to its own max-abs value.
    The global number is the verdict. Per leaf, the key projections' biases (to_k.bias) have an
    exact gradient of zero (a bias on every key adds the same q·b to a whole row of logits,
    which softmax ignores), so their relative error is rounding noise over noise."""
    paths = jax.tree_util.tree_flatten_with_path(g)[0]
    num = den = 0.0
    worst = (0.0, "")
    for (path, a), b in zip(paths, jax.tree.leaves(g_ref)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        num += float(np.sum((a - b) ** 2))
        den += float(np.sum(b ** 2))
        worst = max(worst, (rel_err(a, b), jax.tree_util.keystr(path)))
    return (num / max(den, 1e-30)) ** 0.5, worst


def wan2(run, case):
    """A 2-layer Wan at 1.3B width: cuDNN in bf16 and XLA in bf16, each against XLA in float32
    on the same weights (bf16 values held in float32): output and parameter gradients, with
    and without a text mask. cuDNN must be as close to float32 as XLA's own bf16 is."""
    from ditax import AttentionConfig
    from ditax.models.wan.loading import Transformer
    from ditax.models.wan.build import abstract_model, init_model

    cfg = wan_config(run, 2)
    lat, T, Tl = ((1, 16, 1, 8, 8), 16, 5) if run.dry else ((1, 16, 3, 60, 104), 512, 77)
    fast = "xla" if run.dry else "cudnn"
    tr_fast = Transformer(init_model(cfg, AttentionConfig(backend=fast)))

    def same_weights(backend, dtype):
        c = dataclasses.replace(cfg, dtype=dtype, param_dtype=dtype)
        shape = Transformer(abstract_model(c, AttentionConfig(backend=backend)))
        return jax.tree.unflatten(jax.tree.structure(shape),
                                  [x.astype(dtype) for x in jax.tree.leaves(tr_fast)])

    models = {fast: tr_fast, "xla_bf16": same_weights("xla", "bfloat16")}
    tr_ref = same_weights("xla", "float32")
    x, t = normal(5, lat), jnp.full((1,), 500.0)
    text, ct = normal(6, (1, T, cfg.text_dim)), normal(7, lat, jnp.float32)

    @jax.jit
    def fwd_grad(tr, x, text, mask):
        def loss(tr):
            out = tr(x, t, text, mask)
            return jnp.sum(out.astype(jnp.float32) * ct), out
        (_, out), g = jax.value_and_grad(loss, has_aux=True)(tr)
        return out, g

    # dry: the masked case only (the script's code is the same for both; CPU bf16 is slow)
    for masked in (True,) if run.dry else (False, True):
        mask = prefix((Tl,), T) if masked else None
        out_r, g_r = fwd_grad(tr_ref, x.astype(jnp.float32), text.astype(jnp.float32), mask)
        errs = {}
        for name, tr in models.items():
            out, g = fwd_grad(tr, x, text, mask)
            errs[name] = (rel_err(out, out_r), *leaf_errors(g, g_r))
        e, ge, (we, wleaf) = errs[fast]
        e_x, ge_x, (we_x, _) = errs["xla_bf16"]
        extra = dict(kernels=f"{fast} bf16 vs xla float32", peer="xla bf16", text_mask=masked,
                     tokens=int(np.prod(lat[2:])) // 4)
        run.emit(case, "out_rel_err", e, "", baseline=e_x, ok=e <= 2e-2 and e <= 2 * e_x + 1e-3,
                 **extra)
        run.emit(case, "grad_rel_err", ge, "", baseline=ge_x,
                 ok=ge <= 5e-2 and ge <= 2 * ge_x + 1e-3, worst_leaf=wleaf,
                 worst_leaf_rel_err=we, peer_worst_leaf_rel_err=we_x, **extra)


def wan_full(run, case):
    """Wan 2.1 1.3B at full depth (30 layers), one transformer forward at 480p × 81 frames
    (32,760 tokens, 512 text tokens) in bf16: ditax with cuDNN attention vs diffusers'
    WanTransformer3DModel (torch SDPA) on the same card. Random weights, each its own: this
    times the graph; the 2-layer checks above compare the values."""
    from ditax import AttentionConfig
    from ditax.models.wan.loading import Transformer
    from ditax.models.wan.build import init_model

    cfg = wan_config(run, 30)
    lat, T = ((1, 16, 1, 8, 8), 16) if run.dry else ((1, 16, 21, 60, 104), 512)
    tr = Transformer(init_model(cfg, AttentionConfig(backend="xla" if run.dry else "cudnn")))
    x, text = normal(5, lat), normal(6, (1, T, cfg.text_dim))
    fwd = jax.jit(lambda tr, x, c: tr(x, jnp.full((1,), 500.0), c))
    t0 = time.perf_counter()
    jax.block_until_ready(fwd(tr, x, text))
    first = time.perf_counter() - t0
    t_j = timed(fwd, tr, x, text, repeats=2 if run.dry else 5)
    extra = dict(shape=f"latent {lat}, text {T}", layers=cfg.num_layers,
                 first_call_s=first)
    del tr
    try:
        import torch
        from diffusers import WanTransformer3DModel
    except ImportError as e:
        return run.emit(case, "forward_seconds", t_j, "s", peer=f"absent ({e})", **extra)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        kw = {k: v for k, v in cfg.to_diffusers().items() if k != "_class_name"}
        m = WanTransformer3DModel(**kw).eval()
    keep = set(m._keep_in_fp32_modules or ())   # as from_pretrained(torch_dtype=bf16) keeps
    for name, param in m.named_parameters():
        if not keep & set(name.split(".")):
            param.data = param.data.to(torch.bfloat16)
    args = [torch.from_numpy(np.asarray(a, np.float32)).to(dev, torch.bfloat16)
            for a in (x, text)]
    tt = torch.full((1,), 500.0, device=dev)

    def torch_fwd():
        with torch.no_grad():
            m(args[0], tt, args[1], return_dict=False)
        if dev == "cuda":
            torch.cuda.synchronize()

    t_t = torch_timed(torch_fwd, 2 if run.dry else 5)
    run.emit(case, "forward_seconds", t_j, "s", baseline=t_t, ratio=t_j / t_t,
             peer="diffusers (torch sdpa)", **extra)
    del m
    if dev == "cuda":
        torch.cuda.empty_cache()


def te(run, case):
    from ditax.attention import platform as probes

    if not probes.has_transformer_engine_jax():
        return run.emit(case, "absent", None, reason="transformer_engine.jax is not importable")
    from ditax.attention import attend
    from ditax.attention.te import configure_te

    with configure_te(None):
        for name, (B, Lq, Lk, N, K, lens) in REF_CASES.items():
            q, k, v = normal(1, (B, Lq, N, K)), normal(2, (B, Lk, N, K)), normal(3, (B, Lk, N, K))
            mask = None if lens is None else prefix(lens, Lk)
            outs = [jax.jit(lambda q, k, v, b=b: attend(q, k, v, backend=b, kv_mask=mask))(
                q, k, v) for b in ("te", "cudnn")]
            e = rel_err(*outs)
            run.emit(case, "te_vs_cudnn_rel_err", e, "", shape=name, ok=e <= 2e-2)


def torch_peer(run, case):
    try:
        import torch
    except ImportError:
        return run.emit(case, "absent", None, reason="torch is not importable")
    dev = "cuda" if torch.cuda.is_available() else ("cpu" if run.dry else None)
    if dev is None:
        return run.emit(case, "absent", None, reason="torch has no CUDA device")
    B, L, N, K = (1, 64, 2, 32) if run.dry else (1, 32760, 12, 128)
    qkv = [np.asarray(normal(i, (B, L, N, K)), np.float32) for i in range(3)]
    jq, jk, jv = (jnp.asarray(x, jnp.bfloat16) for x in qkv)
    tq, tk, tv = (torch.from_numpy(x).to(dev, torch.bfloat16).transpose(1, 2) for x in qkv)
    attn = jax.jit(lambda q, k, v: kernel(run)(q, k, v))
    t_ditax = timed(attn, jq, jk, jv, repeats=2 if run.dry else 5)

    def sdpa():
        with torch.no_grad():
            o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
        if dev == "cuda":
            torch.cuda.synchronize()
        return o

    t_torch = torch_timed(sdpa, 2 if run.dry else 5)
    e = rel_err(attn(jq, jk, jv), sdpa().transpose(1, 2).float().cpu().numpy())
    run.emit(case, "attention_seconds", t_ditax, "s", baseline=t_torch, ratio=t_ditax / t_torch,
             peer="torch sdpa", shape=f"B{B}_L{L}_N{N}_K{K}", rel_err=e, ok=e <= 2e-2)
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return run.emit(case, "diffusers_absent", None, reason="diffusers is not importable; "
                        "the attention comparison above is the torch peer")
    diffusers_model(run, case, torch, dev)


def diffusers_model(run, case, torch, dev):
    import ditax
    from diffusers import WanTransformer3DModel

    if run.dry:
        kw = dict(num_attention_heads=2, attention_head_dim=32, text_dim=32, freq_dim=32,
                  ffn_dim=64)
        lat, T = (1, 16, 1, 8, 8), 8
    else:
        kw = dict(num_attention_heads=12, attention_head_dim=128, text_dim=4096, freq_dim=256,
                  ffn_dim=8960)
        lat, T = (1, 16, 3, 60, 104), 512
    torch.manual_seed(0)
    m = WanTransformer3DModel(patch_size=(1, 2, 2), in_channels=16, out_channels=16,
                              num_layers=1 if run.dry else 2, cross_attn_norm=True,
                              rope_max_seq_len=1024, **kw)
    x = np.asarray(normal(5, lat), np.float32)
    text = np.asarray(normal(6, (1, T, kw["text_dim"])), np.float32)
    with tempfile.TemporaryDirectory() as folder:
        m.save_pretrained(folder)
        tr = ditax.load_transformer(folder, dtype="bfloat16",
                                    attention="xla" if run.dry else "cudnn")
        # as diffusers runs it in bf16: its float32 modules stay float32
        m = WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.bfloat16)
    m = m.to(dev).eval()
    args_t = [torch.from_numpy(a).to(dev, torch.bfloat16) for a in (x, text)]
    t_t = torch.full((1,), 500.0, device=dev)
    args_j = [jnp.asarray(a, jnp.bfloat16) for a in (x, text)]
    fwd = jax.jit(lambda tr, x, c: tr(x, jnp.full((1,), 500.0), c))

    def torch_fwd():
        with torch.no_grad():
            o = m(args_t[0], t_t, args_t[1], return_dict=False)[0]
        if dev == "cuda":
            torch.cuda.synchronize()
        return o

    t_j = timed(fwd, tr, *args_j, repeats=2 if run.dry else 3)
    torch_fwd()
    t0 = time.perf_counter()
    o = torch_fwd()
    t_torch = time.perf_counter() - t0
    e = rel_err(fwd(tr, *args_j), o.float().cpu().numpy())
    run.emit(case, "wan2_forward_seconds", t_j, "s", baseline=t_torch, ratio=t_j / t_torch,
             peer="diffusers", rel_err=e, ok=e <= 5e-2)


def train_step(run, case):
    """Wan 2.1 1.3B training step at full depth on one device: 480p × 81 frames (32,760
    tokens), batch 1, bf16, remat full (the preset's), AdamW, cuDNN attention; synthetic
    latents. Step time (median of 5 after the compile), tokens/s, model TFLOP/s and MFU as the
    train loop reports them."""
    from ditax.config import load_config
    from ditax.models.base import model_family
    from ditax.parallel.mesh import make_mesh
    from ditax.train.data import SyntheticSource, latent_shape_for
    from ditax.train.metrics import peak_tflops
    from ditax.train.step import Trainer

    if run.dry:
        cfg = load_config("tiny", ["batch_size=1", "mesh.fsdp=1", "model.num_layers=1",
                                   "data.height=32", "data.width=32"])
    else:
        cfg = load_config("wan2.1-t2v-1.3b", ["data.source=synthetic", "batch_size=1",
                                              "mesh.fsdp=1", "attention.backend=cudnn"])
    tr = Trainer(cfg, make_mesh(cfg.mesh, jax.devices()[:1]))
    state = tr.init()
    lat = latent_shape_for(cfg)
    src = SyntheticSource(lat, (cfg.data.text_len, cfg.model.text_dim), seed=cfg.seed)
    batches = [tr.put_batch({k: v[None] for k, v in src[i].items()}) for i in range(3)]
    t0 = time.perf_counter()
    state, m = tr.step(state, batches[0])
    loss0 = float(m["loss"])
    first = time.perf_counter() - t0
    ts = []
    for i in range(3 if run.dry else 5):
        t0 = time.perf_counter()
        state, m = tr.step(state, batches[i % len(batches)])
        float(m["loss"])
        ts.append(time.perf_counter() - t0)
    t = statistics.median(ts)
    # the train loop's own numbers: model FLOPs (forward + backward, remat not counted) and MFU
    family = model_family(cfg.model)
    tokens = family.tokens_per_sample(lat)
    tflops = family.flops_per_sample(lat, cfg.data.text_len) / t / 1e12
    peak = peak_tflops()
    ok = bool(np.isfinite(loss0) and np.isfinite(float(m["loss"])))
    run.emit(case, "step_seconds", t, "s", tokens=tokens, tokens_per_s=tokens / t,
             model_tflops=tflops, mfu=None if peak is None else tflops / peak,
             params=sum(x.size for x in jax.tree.leaves(state["params"])),
             first_call_s=first, remat=cfg.model.remat, loss_first=loss0, ok=ok)


CHECKS = (("versions", versions, 0), ("matmul_bf16", matmul, 10),
          ("cudnn_vs_reference", vs_reference, 30), ("cudnn_tflops", speed, 30),
          ("wan2", wan2, 60), ("te", te, 10), ("torch", torch_peer, 20),
          ("wan_full", wan_full, 60), ("train_step", train_step, 60))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry", action="store_true", help="CPU, tiny shapes, xla stands in")
    p.add_argument("--budget", type=float, default=300.0, help="seconds for all checks")
    p.add_argument("--only", default="", help="comma-separated checks to run (default: all): "
                   + ", ".join(c for c, _, _ in CHECKS))
    a = p.parse_args(argv)
    only = [c for c in a.only.split(",") if c]
    unknown = sorted(set(only) - {c for c, _, _ in CHECKS})
    if unknown:
        p.error(f"--only: unknown check(s) {unknown}; choose from "
                f"{[c for c, _, _ in CHECKS]}")
    run = Run(a.dry, a.budget)

    def watchdog():
        time.sleep(a.budget + 40)
        run.emit("summary", "deadline", a.budget + 40, "s", ok=False)
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    for case, fn, need in CHECKS:
        if not only or case in only or case == "versions":
            run.check(case, fn, need)
    run.emit("summary", "failed_checks", run.failed, "", lines=run.lines,
             seconds=time.perf_counter() - run.t0, dry=a.dry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
