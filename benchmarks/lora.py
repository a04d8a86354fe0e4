"""LoRA benchmarks (one JSON object per line).

1. ``train``: one optimiser step of LoRA fine-tuning (rank 32 on attn + ffn, base frozen) vs
   full training of the same model on the same mesh, on 8 simulated CPU devices: median step
   time, first-step (compile) time, trainable parameters and the train state's bytes per
   device (parameters + optimiser state [+ frozen base]), measured from the arrays.
   Model: 1.3B width (D=1536, 12 heads, M=8960, text 4096), 2 layers, batch 8,
   9 frames x 128 x 128, float32.
2. ``plan``: per-device memory of a Wan 2.1 14B training step at 480p and 720p (81 frames,
   batch 1, context=8 Ulysses + splash, remat full) compiled deviceless for ``--target``
   (default tpu-v6e-8) through :func:`ditax.plan.plan`: full training (float32 master weights,
   bfloat16 compute) vs LoRA rank 32 (bfloat16 frozen base, float32 adapters). The 40-layer
   program takes too long to compile on a small CPU host, so each case is compiled at
   ``--layers`` (default 1 and 2) and extended linearly to 40 layers
   (``m(40) = m(b) + (40 - b) * (m(b) - m(a))``; parameters, optimiser state and the layer
   inputs kept for the backward all grow linearly with depth); the measured rows are printed
   too; ``state`` (also run by ``plan``): the exact 40-layer train state per device (parameters,
   optimiser state, frozen base) from abstract shapes, no compile. Needs libtpu
   (``pip install -e ".[tpu]"``).
3. ``inference``: transformer forward time (batch 2, as with classifier-free guidance) of the
   same model (1 latent frame, 32 x 32) without LoRA, with a rank-32 LoRA merged, and unmerged
   with one and two LoRAs, on one CPU device, float32; the cases run interleaved.

Run: ``PYTHONPATH=src python benchmarks/lora.py [--part train|plan|inference|all]
[--layers 1,2] [--target tpu-v6e-8] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from ditax.config import load_config  # noqa: E402

GIB = 2 ** 30
FULL_LAYERS = 40
RANK = 32
W13 = ["model.num_layers=2", "model.param_dtype=float32", "model.dtype=float32",
       "model.remat=none", "batch_size=8", "data.num_frames=9", "data.height=128",
       "data.width=128", "data.text_len=64", "data.source=synthetic", "attention.backend=xla",
       "optim.warmup_steps=0"]


def emit(**row):
    print(json.dumps({"bench": "lora", **row}), flush=True)


def _bytes_per_device(tree) -> int:
    """Bytes of the shards on the first device of every array in ``tree``."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shard = leaf.addressable_shards[0].data
        total += shard.size * shard.dtype.itemsize
    return total


# ----------------------------------------------------------------------------------------------
# 1. training step time on CPU


def run_train(steps: int):
    """Per mesh: a full and a LoRA Trainer side by side, their steps interleaved (A B A B ...)
    so that the load of a shared host falls on both alike."""
    from ditax.parallel.mesh import make_mesh
    from ditax.train.batches import BatchIterator
    from ditax.train.step import Trainer

    meshes = [("fsdp8", {"fsdp": 8}, "xla"), ("fsdp2_context4", {"fsdp": 2, "context": 4},
                                               "ulysses")]
    for mesh_name, sizes, backend in meshes:
        runs = {}
        for mode in ("full", f"lora{RANK}"):
            over = W13 + [f"mesh.{k}={v}" for k, v in {"fsdp": 1, "context": 1,
                                                      **sizes}.items()]
            over += [f"attention.backend={backend}"]
            if mode != "full":
                over += [f"lora.rank={RANK}", f"lora.alpha={RANK}", "lora.targets=attn,ffn"]
            cfg = load_config("wan2.1-t2v-1.3b", over)
            tr = Trainer(cfg, make_mesh(cfg.mesh))
            data = BatchIterator(cfg)
            st = tr.init()
            t0 = time.perf_counter()
            st, m = tr.step(st, tr.put_batch(next(data)))
            float(m["loss"])
            runs[mode] = dict(tr=tr, data=data, st=st, first=time.perf_counter() - t0, times=[],
                              cfg=cfg)
        for _ in range(steps):
            for r in runs.values():
                batch = r["tr"].put_batch(next(r["data"]))
                t0 = time.perf_counter()
                r["st"], m = r["tr"].step(r["st"], batch)
                float(m["loss"])
                r["times"].append(time.perf_counter() - t0)
        base = float(np.median(runs["full"]["times"]))
        for mode, r in runs.items():
            st = r["st"]
            trainable = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(st["params"]))
            state = {k: v for k, v in st.items() if k in ("params", "opt", "frozen")}
            common = dict(case=f"1.3b-width-2l/{mesh_name}", mode=mode, mesh=sizes,
                          backend=backend, batch=r["cfg"].batch_size)
            med = float(np.median(r["times"]))
            emit(**common, metric="step_time", value=med, unit="s", baseline=base,
                 ratio=med / base, first_step_s=r["first"], steps=steps,
                 times=[round(t, 3) for t in r["times"]])
            emit(**common, metric="trainable_params", value=trainable, unit="params")
            emit(**common, metric="state_bytes_per_device", value=_bytes_per_device(state) / GIB,
                 unit="GiB", params_gib=_bytes_per_device(st["params"]) / GIB,
                 opt_gib=_bytes_per_device(st["opt"]) / GIB,
                 frozen_gib=_bytes_per_device(st.get("frozen", {})) / GIB)
        del runs


# ----------------------------------------------------------------------------------------------
# 2. 14B training memory, deviceless TPU

MEM_KEYS = ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "peak_bytes")
RESOLUTIONS = {"480p": (480, 832), "720p": (720, 1280)}


def _state_gib(tree) -> float:
    """Per-device GiB of an abstract (``ShapeDtypeStruct`` with shardings) tree."""
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree)) / GIB


def run_state(target_name: str):
    """The 40-layer train state per device (parameters, optimiser state, frozen base), exact,
    from the abstract state's shapes and shardings: nothing is compiled."""
    from ditax.parallel import make_mesh
    from ditax.plan.targets import parse_target, topology_devices
    from ditax.train.step import Trainer

    target = parse_target(target_name)
    for mode in ("full", f"lora{RANK}"):
        cfg = load_config("wan2.1-t2v-14b", _plan_overrides("480p", mode, FULL_LAYERS))
        st = Trainer(cfg, make_mesh(cfg.mesh, topology_devices(target))).abstract_state()
        parts = {k: _state_gib(st[k]) for k in ("params", "opt", "frozen") if k in st}
        emit(case="14b/context8", mode=mode, layers=FULL_LAYERS, target=target_name,
             metric="train_state_per_device", value=sum(parts.values()), unit="GiB",
             **{f"{k}_gib": v for k, v in parts.items()},
             trainable_params=sum(int(np.prod(x.shape)) for x in jax.tree.leaves(st["params"])))


def _plan_overrides(res: str, mode: str, layers: int) -> list[str]:
    h, w = RESOLUTIONS[res]
    over = [f"model.num_layers={layers}", "mesh.fsdp=1", "mesh.context=8",
            "attention.backend=ulysses", "attention.local=splash", "attention.block_q=512",
            "attention.block_kv=512", "batch_size=1", f"data.height={h}", f"data.width={w}",
            "data.num_frames=81", "model.remat=full", "model.dtype=bfloat16"]
    if mode == "full":
        return over + ["model.param_dtype=float32"]
    return over + ["model.param_dtype=bfloat16", f"lora.rank={RANK}", f"lora.alpha={RANK}",
                   "lora.targets=attn,ffn"]


def _plan_case(target_name: str, res: str, mode: str, layers: int):
    from ditax.parallel import make_mesh
    from ditax.plan import plan
    from ditax.plan.targets import parse_target, topology_devices

    target = parse_target(target_name)
    over = _plan_overrides(res, mode, layers)
    cfg = load_config("wan2.1-t2v-14b", over)
    mesh = make_mesh(cfg.mesh, topology_devices(target))
    t0 = time.perf_counter()
    res_ = plan(cfg, mesh, train=True, chip=target.chip)
    step = res_["train_step"]
    return step, time.perf_counter() - t0, target.chip


def run_plan(target: str, layer_list: list[int]):
    for res in RESOLUTIONS:
        for mode in ("full", f"lora{RANK}"):
            measured = {}
            for n in layer_list:
                try:
                    step, secs, chip = _plan_case(target, res, mode, n)
                except Exception as e:  # noqa: BLE001 - one refused case must not hide others
                    emit(case=f"14b-{res}-81f/context8", mode=mode, layers=n, metric="error",
                         value=None, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
                    continue
                if "error" in step:
                    emit(case=f"14b-{res}-81f/context8", mode=mode, layers=n, target=target,
                         metric="fits", value=False, error=step["error"], plan_s=secs)
                    continue
                measured[n] = step
                emit(case=f"14b-{res}-81f/context8", mode=mode, layers=n, target=target,
                     metric="train_step_peak_bytes_per_device", value=step["peak_bytes"] / GIB,
                     unit="GiB", **{k.replace("_bytes", "_gib"): step[k] / GIB
                                    for k in MEM_KEYS if k != "peak_bytes"},
                     compile_s=step.get("compile_s"), plan_s=secs)
            if len(measured) >= 2:
                a, b = sorted(measured)[:2]
                ext = {k: measured[b][k] + (FULL_LAYERS - b) * (measured[b][k] - measured[a][k])
                                               / (b - a) for k in MEM_KEYS}
                hbm = chip.hbm_bytes
                emit(case=f"14b-{res}-81f/context8", mode=mode, layers=FULL_LAYERS,
                     target=target, metric="train_step_peak_bytes_per_device",
                     value=ext["peak_bytes"] / GIB, unit="GiB",
                     **{k.replace("_bytes", "_gib"): ext[k] / GIB for k in MEM_KEYS
                        if k != "peak_bytes"},
                     extrapolated_from_layers=[a, b], hbm_gib=hbm / GIB,
                     fits=bool(ext["peak_bytes"] <= hbm))


# ----------------------------------------------------------------------------------------------
# 3. merged vs unmerged inference


def _write_model(folder: pathlib.Path, cfg):
    from flax import nnx
    from safetensors.numpy import save_file

    from ditax.io.convert import export
    from ditax.models.wan.convert import config_weight_table
    from ditax.models.wan.build import init_model

    tensors = export(config_weight_table(cfg), nnx.state(init_model(cfg), nnx.Param))
    folder.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg.to_diffusers()))
    return tensors


def _write_lora(path: pathlib.Path, tensors: dict, seed: int):
    """A rank-32 original-format LoRA on every attention and FFN Linear of the blocks."""
    from safetensors.numpy import save_file

    from ditax.models.wan.original_names import to_original

    rng = np.random.default_rng(seed)
    out = {}
    for key, w in tensors.items():
        if not key.startswith("blocks.") or not key.endswith(".weight") or w.ndim != 2:
            continue
        if not any(p in key for p in (".attn1.", ".attn2.", ".ffn.")) or ".norm" in key:
            continue
        o = "diffusion_model." + to_original(key.removesuffix(".weight"))
        out[f"{o}.lora_down.weight"] = (0.01 * rng.standard_normal((RANK, w.shape[1]))).astype(
            np.float32)
        out[f"{o}.lora_up.weight"] = (0.01 * rng.standard_normal((w.shape[0], RANK))).astype(
            np.float32)
        out[f"{o}.alpha"] = np.asarray(RANK, np.float32)
    save_file(out, str(path))
    return path


def run_inference(repeats: int):
    import ditax

    cfg = load_config("wan2.1-t2v-1.3b", ["model.num_layers=2", "model.param_dtype=float32",
                                          "model.dtype=float32", "model.remat=none"]).model
    tmp = pathlib.Path(tempfile.mkdtemp())
    tensors = _write_model(tmp / "transformer", cfg)
    a, b = _write_lora(tmp / "a.safetensors", tensors, 1), _write_lora(tmp / "b.safetensors",
                                                                       tensors, 2)
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((2, 16, 1, 32, 32)).astype(np.float32)
    t = np.array([500.0, 500.0], np.float32)
    text = rng.standard_normal((2, 512, 4096)).astype(np.float32)
    cases = [("none", {}), ("merged", dict(loras=[(a, 1.0)])),
             ("unmerged_1", dict(loras=[(a, 1.0)], lora_mode="unmerged")),
             ("unmerged_2", dict(loras=[(a, 1.0), (b, 0.5)], lora_mode="unmerged"))]
    runs = {}
    for name, kw in cases:
        t0 = time.perf_counter()
        tr = ditax.load_transformer(tmp / "transformer", **kw)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = np.asarray(jax.block_until_ready(tr(lat, t, text)))
        runs[name] = dict(tr=tr, load_s=load_s, first=time.perf_counter() - t0, out=out,
                          times=[])
    for _ in range(repeats):      # interleaved, so a shared host's load falls on all alike
        for r in runs.values():
            t0 = time.perf_counter()
            jax.block_until_ready(r["tr"](lat, t, text))
            r["times"].append(time.perf_counter() - t0)
    base = float(np.median(runs["none"]["times"]))
    for name, r in runs.items():
        med = float(np.median(r["times"]))
        diff = float(np.abs(r["out"] - runs["merged"]["out"]).max())
        emit(case="1.3b-width-2l/forward-b2-1x32x32", mode=name, metric="forward_time",
             value=med, unit="s", baseline=base, ratio=med / base, load_s=r["load_s"],
             first_call_s=r["first"], repeats=repeats,
             max_abs_diff_vs_merged=None if name == "none" else diff)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="all", choices=("train", "plan", "state", "inference", "all"))
    p.add_argument("--target", default="tpu-v6e-8")
    p.add_argument("--layers", default="1,2", help="14B layer counts compiled for --part plan")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(argv)
    if a.part in ("train", "all"):
        run_train(a.steps)
    if a.part in ("inference", "all"):
        run_inference(a.repeats)
    if a.part in ("plan", "state", "all"):
        run_state(a.target)
    if a.part in ("plan", "all"):
        run_plan(a.target, [int(x) for x in a.layers.split(",")])


if __name__ == "__main__":
    sys.exit(main())
