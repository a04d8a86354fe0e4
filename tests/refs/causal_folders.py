"""A tiny causal Wan folder for the generate / serve tests (issue 59): the shipped demo model
with ``causal_chunk`` in its transformer's config.json (its weights linked, not copied) and a
``ditax_sample.json`` saying how to sample it chunk by chunk. Untrained as a causal student:
the tests compare paths (CLI, server, library stream), not quality."""

from __future__ import annotations

import json
import pathlib

import ditax.demo

# the folder's sampling defaults: 13 frames = 4 latent frames = 2 chunks of 2
SAMPLE = {"height": 64, "width": 64, "num_frames": 13, "num_inference_steps": 2,
          "guidance_scale": 1.0, "negative_prompt": "", "max_sequence_length": 16,
          "context_chunks": 1}


def causal_demo_folder(root, chunk: int | None = 2, sample: dict | None = None) -> pathlib.Path:
    """``root/causal_demo``: the demo's components linked, its transformer's config.json with
    ``causal_chunk=chunk`` (None: none, the demo's own), ``ditax_sample.json`` = ``sample``
    (default :data:`SAMPLE`)."""
    demo = pathlib.Path(ditax.demo.model_path())
    out = pathlib.Path(root) / "causal_demo"
    (out / "transformer").mkdir(parents=True)
    for part in demo.iterdir():
        if part.name not in ("transformer", "manifest.json", "ditax_sample.json"):
            (out / part.name).symlink_to(part)
    for f in (demo / "transformer").iterdir():
        if f.name != "config.json":
            (out / "transformer" / f.name).symlink_to(f)
    config = json.loads((demo / "transformer" / "config.json").read_text())
    if chunk is not None:
        config["causal_chunk"] = chunk
    (out / "transformer" / "config.json").write_text(json.dumps(config))
    (out / "ditax_sample.json").write_text(json.dumps(SAMPLE if sample is None else sample))
    return out
