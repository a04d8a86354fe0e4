"""Small random latent datasets (the ``tiny`` preset's shapes) that the training tests write."""

import numpy as np

from ditax.config import load_config
from ditax.train.data_writer import DatasetWriter


def write_dataset(path, n=24, nan_at=None, seed=0, null=False):
    """``n`` random samples (latents [16, 2, 8, 8], text [16, 64]); ``null``: with an empty
    prompt's embedding (for text dropout and distillation's guidance)."""
    r = np.random.default_rng(seed)
    w = DatasetWriter(path, samples_per_file=10)
    for i in range(n):
        lat = r.standard_normal((16, 2, 8, 8)).astype(np.float32)
        if i == nan_at:
            lat[0, 0, 0, 0] = np.nan
        k = int(r.integers(1, 17))
        mask = (np.arange(16) < k).astype(np.uint8)
        w.add(lat, r.standard_normal((16, 64)).astype(np.float32) * mask[:, None], mask)
    if null:
        return str(w.close(null_text=(r.standard_normal((16, 64)).astype(np.float32) * 0.1,
                                      (np.arange(16) < 1).astype(np.uint8))))
    return str(w.close())


def run_cfg(out, dataset, *extra):
    """The ``tiny`` preset training on ``dataset`` into ``out``, a checkpoint every 2 steps."""
    return load_config("tiny", [f"data.source={dataset}", f"output_dir={out}", "checkpoint.every=2",
                                *extra])
