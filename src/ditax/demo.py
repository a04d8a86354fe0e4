"""``make demo``: the main job on a fresh machine, no downloads.

Placeholder until the text-to-video pipeline lands: builds a small random Wan transformer,
shards it on an 8-device CPU mesh (fsdp=2 × context=4), runs one forward and prints shapes,
timings and the single-device agreement.
"""

from __future__ import annotations

import os
import time


def main() -> int:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import jax
    import numpy as np

    from ditax.config import AttentionConfig, ModelConfig
    from ditax.models.wan.loading import Transformer, init_model
    from ditax.parallel import make_mesh

    print("ditax demo (PLACEHOLDER: random weights, transformer forward only)")
    cfg = ModelConfig(num_attention_heads=4, attention_head_dim=32, ffn_dim=256, num_layers=2,
                      text_dim=64, freq_dim=32)
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((2, 16, 3, 16, 16)).astype(np.float32)
    t = np.array([500.0, 250.0], np.float32)
    text = rng.standard_normal((2, 16, 64)).astype(np.float32)
    single = Transformer(init_model(cfg, seed=0))
    mesh = make_mesh({"fsdp": 2, "context": 4})
    sharded = Transformer(init_model(cfg, AttentionConfig(), mesh, seed=0), mesh)
    for name, tr in (("1 device", single), (f"mesh {dict(mesh.shape)}", sharded)):
        t0 = time.perf_counter()
        out = jax.block_until_ready(tr(lat, t, text))
        t1 = time.perf_counter()
        jax.block_until_ready(tr(lat, t, text))
        t2 = time.perf_counter()
        print(f"  {name:40s} out {tuple(out.shape)}  compile+run {t1 - t0:.2f}s  run {t2 - t1:.3f}s")
    diff = float(np.max(np.abs(np.asarray(single(lat, t, text)) - np.asarray(sharded(lat, t, text)))))
    print(f"  max |single - sharded| = {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
