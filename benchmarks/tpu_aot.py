"""Wan 2.1 14B at 720p / 81 frames compiled ahead of time for TPU slices, without a TPU
(issue 11): per mesh and attention mode, the per-device memory of the forward (and of one
training step), relayout copies per layer and per forward, collective bytes, compile time and
roofline estimates, from :func:`ditax.plan.plan` on a deviceless topology mesh.

  PYTHONPATH=src python benchmarks/tpu_aot.py [--target tpu-v6e-8] [--cases NAME,...]
      [--layers 40] [--train] [--steps 50] [--dump-hlo DIR] [--label TEXT]

Prints one JSON object per case. ``--layers n`` (< 40) compiles an n-layer model (the layer
scan compiles once, so per-layer numbers are exact) and scales the per-forward counts to 40
layers as ``outside the loop + 40 x per layer`` (``"scaled_from_layers": n`` says so); the
forward's arguments get the 40-layer parameters (exact), the train step's arguments and
outputs scale with them; temporaries are not scaled (the scan reuses its buffers).
Video estimates: ``steps`` x 2 (classifier-free guidance) forwards of the roofline time, per
video (a forward of batch B makes B videos' progress); Wan 2.2 A14B (two 14B experts of the
same shape) at 40 steps sits next to the seed's published 128.9 s on v6e-8 (``ratio``).
Needs libtpu (``pip install -e ".[tpu]"``); each case compiles for minutes on 2 cores.
"""

import argparse
import json
import os
import sys
from dataclasses import replace

os.environ.setdefault("JAX_PLATFORMS", "cpu")

CASES = {   # name: (mesh, attention overrides)
    "fsdp8-splash": ({"fsdp": 8}, {"backend": "splash"}),
    "fsdp8-flash": ({"fsdp": 8}, {"backend": "flash"}),
    "context8-ulysses-splash-flat": ({"context": 8}, {"backend": "ulysses", "local": "splash"}),
    "context8-ulysses-flash-flat": ({"context": 8}, {"backend": "ulysses", "local": "flash"}),
    "context8-ulysses-flash-chunked": ({"context": 8}, {"backend": "ulysses", "local": "flash",
                                                        "out_a2a": "chunked"}),
    "context8-ulysses-flash-shard_major": ({"context": 8}, {
        "backend": "ulysses", "local": "flash", "out_a2a": "shard_major"}),
    "context8-ring-flash": ({"context": 8}, {"backend": "ring", "local": "flash"}),
    "fsdp2xcontext4-ulysses-flash-flat": ({"fsdp": 2, "context": 4}, {
        "backend": "ulysses", "local": "flash"}),
    "fsdp2xcontext4-ulysses-flash-shard_major": ({"fsdp": 2, "context": 4}, {
        "backend": "ulysses", "local": "flash", "out_a2a": "shard_major"}),
}
FULL_LAYERS = 40
A14B_SEED_S = 128.9   # the seed's published Wan 2.2 A14B 720p/81f/40 steps on v6e-8, seconds
SCALED = ("copy_ops", "copy_bytes", "fused_copy_ops", "fused_copy_bytes", "a2a_copy_ops",
          "a2a_copy_bytes", "all_to_all_ops", "tpu_custom_calls", "xla_flops", "hbm_bytes")


def scale(p: dict, layers: int, loops_per_step: int, params: tuple[int, int]) -> dict:
    """Counts of an ``layers``-layer compile extended to 40 layers (see module docstring);
    ``params``: parameter bytes per device of the compiled and of the 40-layer model."""
    lay = p.get("per_layer")
    if lay is None or layers == FULL_LAYERS:
        return p
    extra = (FULL_LAYERS - layers) * loops_per_step
    out = dict(p)
    if loops_per_step == 1:        # forward arguments: the parameters and the inputs
        out["argument_bytes"] = p["argument_bytes"] + params[1] - params[0]
    else:                          # train step: parameters, optimiser state (and the batch)
        out["argument_bytes"] = round(p["argument_bytes"] * params[1] / params[0])
        out["output_bytes"] = round(p["output_bytes"] * params[1] / params[0])
    for k in SCALED:
        out[k] = p[k] + extra * lay[k]
    out["collective_bytes"] = {k: v + extra * lay["collective_bytes"].get(k, 0)
                               for k, v in p["collective_bytes"].items()}
    out["model_flops"] = p["model_flops"] * FULL_LAYERS / layers     # layers dominate
    out["flops"] = max(out["model_flops"], out["xla_flops"])
    out["scaled_from_layers"] = layers
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="tpu-v6e-8")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--layers", type=int, default=FULL_LAYERS)
    ap.add_argument("--train", action="store_true", help="also one training step (remat full)")
    ap.add_argument("--steps", type=int, default=50, help="denoising steps of the video")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--label", default=None,
                    help='tag every row with "code": LABEL (which code state it measures)')
    ap.add_argument("--dump-hlo", default=None, metavar="DIR",
                    help="write each case's compiled forward HLO to DIR/<case>.hlo")
    a = ap.parse_args()

    from ditax.config import load_config
    from ditax.parallel import make_mesh
    from ditax.plan import plan
    from ditax.plan.measure import roofline
    from ditax.plan.targets import parse_target, topology_devices

    target = parse_target(a.target)
    devices = topology_devices(target)
    for name in a.cases.split(","):
        sizes, attn = CASES[name]
        over = [f"mesh.{k}={v}" for k, v in {"fsdp": 1, "context": 1, **sizes}.items()]
        over += [f"attention.{k}={v}" for k, v in attn.items()]
        over += [f"attention.block_q={a.block}", f"attention.block_kv={a.block}",
                 f"model.num_layers={a.layers}", f"batch_size={sizes.get('fsdp', 1)}"]
        cfg = load_config("wan2.1-t2v-14b", over)
        mesh = make_mesh(cfg.mesh, devices)
        try:
            hlo = None if a.dump_hlo is None else os.path.join(a.dump_hlo, f"{name}.hlo")
            res = plan(cfg, mesh, compile_=True, train=a.train, chip=target.chip,
                       hlo_path=hlo)
            full = plan(replace(cfg, model=replace(cfg.model, num_layers=FULL_LAYERS)),
                        mesh)["param_bytes_per_device"]
        except Exception as e:  # one refused case must not hide the others
            print(json.dumps({"bench": "tpu_aot", "case": name, "target": a.target,
                              "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}),
                  flush=True)
            continue
        for prog, loops in (("forward", 1), ("train_step", 2)):
            if prog not in res:
                continue
            if "error" in res[prog]:    # does not fit: XLA's message says by how much
                print(json.dumps({"bench": "tpu_aot", "case": name, "program": prog,
                                  "target": a.target, "mesh": res["mesh"], **res[prog]}),
                      flush=True)
                continue
            p = scale(res[prog], a.layers, loops, (res["param_bytes_per_device"], full))
            p["roofline"] = roofline(p["flops"], p["hbm_bytes"], p["collective_bytes"],
                                     target.chip)
            row = {"bench": "tpu_aot", **({"code": a.label} if a.label else {}),
                   "case": name, "program": prog, "target": a.target,
                   "mesh": res["mesh"], "attention": attn, "block": a.block,
                   "param_bytes_per_device": full, **p}
            row.pop("loops", None)
            if prog == "forward":      # one video = steps x 2 forwards (CFG) of batch B
                per_call = p["roofline"]["estimate_s"] * 2 / p["latent"][0]
                row["video_estimate_s"] = per_call * a.steps
                # Wan 2.2 A14B: two experts of this 14B shape, 40 steps, 720p / 81 frames
                row["a14b_40_steps_estimate_s"] = per_call * 40
                row["baseline"] = A14B_SEED_S
                row["ratio"] = row["a14b_40_steps_estimate_s"] / A14B_SEED_S
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
