"""The demo model fine-tuned with VSA (``attention.sparsity=vsa``), for
``benchmarks/sparse_quality.py``: a short full fine-tune (the gates with the rest) of the shipped
demo model on fresh synthetic clips of its seen combinations, exported as a pipeline folder.

    python benchmarks/sparse_finetune.py OUT [--steps 400] [--batch 8] [--topk 8] [--tile 1,2,2]
        [--target data|dense_teacher]

``--topk 0`` runs the same fine-tune dense: the control that tells what the fine-tune alone
(its data, its steps) does to the score. ``--target dense_teacher`` (``flow.target``) trains
the VSA model to reproduce the frozen demo model run dense (its velocity at the same noisy
clip, timestep and text) instead of the clips' velocity: the data give only the inputs.

Stages into ``OUT`` (each skipped when its marker is there, so a rerun resumes):

1. ``clips`` + ``latents``: :func:`ditax.synthetic.clips.write_dataset` (seen combinations,
   30% paraphrased captions, as the demo's own data; a seed of its own), encoded by ``ditax
   preprocess`` with the demo model's VAE and UMT5;
2. ``run``: ``ditax train`` from the demo model (``init_from``), flow matching with the demo
   recipe's noise levels (uniform, shifted by 3) and text dropout (0.1, so the unconditional
   branch of guidance stays trained), towards ``flow.target`` (data or dense_teacher), under ``attention.sparsity=vsa attention.topk=K
   attention.tile=T,H,W``;
3. ``folder``: the run exported (:func:`ditax.train.export.export_run`) as bfloat16 weights, as
   the demo model's; its gates under their diffusers-style names. Load it with the same
   ``attention`` settings.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

DATA_SEED = 4242          # the clips' seed: none of the demo recipes' (0, 7)
TEXT_LEN = 16


def vsa_overrides(topk: int, tile) -> list[str]:
    """The ``attention.*`` overrides of a VSA model with ``topk`` key tiles of ``tile`` (none
    for ``topk`` 0: the dense model, the fine-tune's control)."""
    if not topk:
        return []
    return ["attention.sparsity=vsa", f"attention.topk={topk}",
            f"attention.tile={','.join(str(int(n)) for n in tile)}"]


def make_latents(out: pathlib.Path, teacher: pathlib.Path, clips: int, say=print):
    """Synthetic clips (seen combinations) encoded with ``teacher``'s encoders: ``out/latents``."""
    from ditax.synthetic.clips import write_dataset
    from ditax.train.preprocess import preprocess

    if (out / "latents" / "meta.json").is_file():
        return out / "latents"
    write_dataset(out / "clips", clips, DATA_SEED, height=64, width=64, num_frames=17,
                  paraphrase_fraction=0.3)
    preprocess(out / "clips", out / "latents", teacher, height=64, width=64, frames=17,
               text_len=TEXT_LEN, batch=8, say=say)
    return out / "latents"


def train_config(out: pathlib.Path, teacher: pathlib.Path, *, steps: int, batch: int,
                 lr: float, topk: int, tile, seed: int = 0, target: str = "data"):
    """The ``ditax train`` config of the fine-tune (module docstring, stage 2)."""
    from ditax.config import load_config

    t = json.loads((teacher / "transformer" / "config.json").read_text())
    model = [f"model.{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in t.items()
             if not k.startswith("_") and k not in ("image_dim", "added_kv_proj_dim",
                                                    "pos_embed_seq_len")]
    return load_config("tiny", model + vsa_overrides(topk, tile) + [
        "mesh.fsdp=-1", f"init_from={teacher}", f"data.source={out / 'latents'}",
        "data.num_frames=17", "data.height=64", "data.width=64", f"data.text_len={TEXT_LEN}",
        "data.text_dropout=0.1", f"steps={steps}", f"batch_size={batch}", f"seed={seed}",
        f"optim.learning_rate={lr}", f"optim.warmup_steps={min(20, steps // 5)}",
        "optim.schedule=cosine", "optim.weight_decay=0.0", "log_every=10",
        f"checkpoint.every={steps}", "checkpoint.keep=1", "flow.timestep_sampler=uniform",
        "flow.shift=3.0", f"flow.target={target}", "model.remat=none",
        f"output_dir={out / 'run'}"])


def finetune(out, *, steps: int = 400, batch: int = 8, lr: float = 1e-4, topk: int = 8,
             tile=(1, 2, 2), clips: int = 240, teacher=None, target: str = "data",
             say=print) -> dict:
    """Stages 1-3 (module docstring) into ``out``; the record (settings, losses, the folder)."""
    import time

    from ditax.demo import model_path
    from ditax.train.export import export_run, plan_export
    from ditax.train.loop import train

    out = pathlib.Path(out)
    teacher = pathlib.Path(teacher or model_path())
    record = {"steps": steps, "batch": batch, "lr": lr, "topk": topk, "tile": list(tile),
              "clips": clips, "data_seed": DATA_SEED, "target": target}
    t0 = time.perf_counter()
    make_latents(out, teacher, clips, say=say)
    record["data_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    res = train(train_config(out, teacher, steps=steps, batch=batch, lr=lr, topk=topk,
                             tile=tile, target=target), progress=False, say=say)
    record["train_seconds"] = round(time.perf_counter() - t0, 1)
    losses = [float(x) for x in res.losses]
    k = max(1, len(losses) // 10)
    record.update(first_losses_mean=round(sum(losses[:k]) / k, 4) if losses else None,
                  last_losses_mean=round(sum(losses[-k:]) / k, 4) if losses else None)
    folder = out / "folder"
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    export_run(plan_export(out / "run", folder, base=teacher, dtype="bfloat16"), say=say)
    record["folder"] = str(folder)
    (out / "finetune.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--tile", default="1,2,2")
    p.add_argument("--clips", type=int, default=240)
    p.add_argument("--target", default="data", choices=("data", "dense_teacher"))
    a = p.parse_args(argv)
    rec = finetune(a.out, steps=a.steps, batch=a.batch, lr=a.lr, topk=a.topk,
                   tile=tuple(int(n) for n in a.tile.split(",")), clips=a.clips,
                   target=a.target)
    print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
