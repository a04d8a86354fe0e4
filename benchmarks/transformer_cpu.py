"""Transformer forward: ditax (JAX, CPU) vs diffusers (torch, CPU), same weights, float32.

Prints JSON lines:
  * forward median time of both at a 1.3B-width config (D=1536, 12 heads, FFN 8960, 2 layers)
    on a 5×32×32 latent with 512 text tokens, the ratio, and ditax's compile time;
  * compile time of the full Wan 14B graph (40 layers) and of a 10-layer cut, lowered from
    abstract shapes (nothing allocated), to show that scanning keeps compile time flat in depth.
Usage: python benchmarks/transformer_cpu.py [--repeats 5] [--threads 2] [--skip-torch]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")


def emit(**kw):
    print(json.dumps(kw), flush=True)


def bench_forward(args):
    import jax
    import numpy as np
    import torch
    from diffusers import WanTransformer3DModel

    import ditax

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    m = WanTransformer3DModel(num_attention_heads=12, attention_head_dim=128, in_channels=16,
                              out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960,
                              num_layers=2).eval()
    folder = pathlib.Path(tempfile.mkdtemp()) / "wan13b_2l"
    m.save_pretrained(folder)
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((1, 16, 5, 32, 32)).astype(np.float32)
    t = np.array([500.0], np.float32)
    text = rng.standard_normal((1, 512, 4096)).astype(np.float32)

    tr = ditax.load_transformer(folder)
    t0 = time.perf_counter()
    out = jax.block_until_ready(tr(lat, t, text))
    first = time.perf_counter() - t0
    jt = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(tr(lat, t, text))
        jt.append(time.perf_counter() - t0)
    tt = []
    with torch.no_grad():
        tl, tts, ttext = (torch.from_numpy(lat), torch.from_numpy(t), torch.from_numpy(text))
        ref = m(tl, tts, ttext, return_dict=False)[0]
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            m(tl, tts, ttext, return_dict=False)
            tt.append(time.perf_counter() - t0)
    err = float(np.abs(np.asarray(out) - ref.numpy()).max())
    jm, tm = statistics.median(jt), statistics.median(tt)
    emit(bench="transformer_cpu", case="wan1.3b_width_2layers_5x32x32_text512", metric="forward",
         value=jm, unit="s", baseline=tm, baseline_name=f"diffusers(torch {torch.__version__}, "
         f"{args.threads} threads)", ratio=tm / jm, compile_plus_first_s=first - jm,
         max_abs_diff=err, repeats=args.repeats, jax=jax.__version__,
         devices=str(jax.devices()[0].platform))


def bench_compile(args):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from ditax.config import load_config, replace
    from ditax.models.wan.build import abstract_model

    base = load_config("wan2.1-t2v-14b").model
    for layers in (10, 40):
        cfg = replace(base, num_layers=layers, param_dtype="bfloat16", dtype="bfloat16")
        gdef, state = nnx.split(abstract_model(cfg))

        def fwd(state, lat, t, text):
            return nnx.merge(gdef, state)(lat, t, text)

        lat = jax.ShapeDtypeStruct((1, 16, 21, 90, 160), jnp.bfloat16)   # 720p, 81 frames
        t = jax.ShapeDtypeStruct((1,), jnp.float32)
        text = jax.ShapeDtypeStruct((1, 512, 4096), jnp.bfloat16)
        t0 = time.perf_counter()
        lowered = jax.jit(fwd).lower(state, lat, t, text)
        t1 = time.perf_counter()
        lowered.compile()
        t2 = time.perf_counter()
        nparams = sum(int(jnp.size(x)) if hasattr(x, "shape") else 0 for x in jax.tree.leaves(state))
        emit(bench="transformer_cpu", case=f"wan14b_{layers}layers_720p_abstract",
             metric="compile_time", value=t2 - t0, unit="s", lower_s=t1 - t0,
             compile_s=t2 - t1, params=nparams, note="lowered from ShapeDtypeStructs; "
             "nothing allocated; blocks run under nnx.scan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--skip-torch", action="store_true", help="only the compile benchmark")
    ap.add_argument("--skip-compile", action="store_true")
    args = ap.parse_args()
    if not args.skip_torch:
        bench_forward(args)
    if not args.skip_compile:
        bench_compile(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
