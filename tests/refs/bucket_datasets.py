"""Small bucketed latent datasets (``meta.json`` version 2, /work/notes/issue44_format.md) that
the bucketed-training tests write: one :class:`~ditax.train.data_writer.DatasetWriter` per bucket
subfolder (its own ``meta.json`` removed: the dataset's is the only one) and the v2
``meta.json`` over them, as ``ditax preprocess`` writes it."""

import json
import pathlib

import numpy as np

from ditax.train.data import FORMAT, NULL_TEXT
from ditax.train.data_writer import DatasetWriter

#: the ``tiny`` preset's buckets: name (WIDTHxHEIGHTxFRAMES) -> latent [C, F, Y, X]
TINY_BUCKETS = {"64x64x5": (16, 2, 8, 8), "128x64x5": (16, 2, 8, 16),
                "64x128x5": (16, 2, 16, 8)}


def _size(name):
    w, h, f = (int(v) for v in name.split("x"))
    return w, h, f


def write_bucketed(path, counts: dict, *, shapes: dict | None = None, text_shape=(16, 64),
                   seed=0, null=False, condition=None, samples_per_file=4):
    """A v2 dataset at ``path`` with ``counts[name]`` random samples in each bucket (latent
    shapes from ``shapes``, else :data:`TINY_BUCKETS`). ``condition(latent_shape)``: the
    condition entries' shapes of a bucket (name -> shape), random values. ``null``: an empty
    prompt's embedding. Returns ``(path, {name: latents [n, C, F, Y, X]})``: each bucket's
    records in record order (to recognise them in batches)."""
    path = pathlib.Path(path)
    shapes = shapes or TINY_BUCKETS
    r = np.random.default_rng(seed)
    T, Dt = text_shape
    buckets, files, written = [], [], {}
    for name, n in counts.items():
        lat_shape = tuple(shapes[name])
        cond = dict(condition(lat_shape)) if condition else {}
        w = DatasetWriter(path / name, samples_per_file=samples_per_file)
        lats = []
        for _ in range(n):
            lat = r.standard_normal(lat_shape).astype(np.float32)
            k = int(r.integers(1, T + 1))
            mask = (np.arange(T) < k).astype(np.uint8)
            w.add(lat, r.standard_normal((T, Dt)).astype(np.float32) * mask[:, None], mask,
                  **{c: r.standard_normal(s).astype(np.float32) for c, s in cond.items()})
            lats.append(lat)
        w.close()
        (path / name / "meta.json").unlink()
        width, height, frames = _size(name)
        b = {"name": name, "width": width, "height": height, "frames": frames,
             "latent_shape": list(lat_shape), "num_samples": n,
             "files": [f"{name}/{f}" for f in w.files]}
        if cond:
            b["condition"] = {c: list(s) for c, s in cond.items()}
        buckets.append(b)
        files += b["files"]
        written[name] = np.stack(lats)
    meta = {"format": FORMAT, "version": 2, "num_samples": sum(counts.values()),
            "text_shape": [T, Dt], "buckets": buckets, "files": files, "resize": "crop",
            "skipped": [], "num_processes": 1}
    if null:
        from safetensors.numpy import save_file

        save_file({"text": r.standard_normal((T, Dt)).astype(np.float32) * 0.1,
                   "text_mask": (np.arange(T) < 1).astype(np.uint8)}, str(path / NULL_TEXT))
        meta["null_text"] = NULL_TEXT
    (path / "meta.json").write_text(json.dumps(meta, indent=1))
    return str(path), written
