"""Wan's sampling defaults and sample presets: what a call uses where neither the caller nor the
folder's ``ditax_sample.json`` (:mod:`.sample_defaults`) gives a value, and the named bundles
``sample.preset=NAME`` writes into the ``sample`` config section.

Plain data (no JAX): the config package reads it when it builds the ``sample`` section's
defaults (:mod:`ditax.config.sample`, through :mod:`ditax.pipelines.family`), before any
platform is chosen.

``lightning-4step`` is the schedule the 4-step distillation LoRAs (LightX2V, Wan 2.1 / 2.2
"Lightning") were distilled on: Euler on the flow sigmas 1, 0.75, 0.5, 0.25 shifted by 5 —
timesteps 1000, 937.5, 833.3, 625 — without classifier-free guidance (on Wan 2.2 A14B the
boundary 875 gives each expert two steps).
"""

from __future__ import annotations

from typing import Any

# Wan 2.1 at 480p: 480x832, 81 frames (16 fps), 50 steps, guidance 5, 512 text tokens
SAMPLE_DEFAULTS: dict[str, Any] = {
    "height": 480,
    "width": 832,
    "num_frames": 81,
    "num_inference_steps": 50,
    "guidance_scale": 5.0,
    "guidance_scale_2": None,       # the low-noise expert's scale (Wan 2.2); None = guidance_scale
    "max_sequence_length": 512,
    "negative_prompt": None,
    "fps": 16,                      # of the written video
    "context_chunks": None,         # a causal student's KV cache: chunks beside the sink
}

# preset name -> the sample fields it sets
SAMPLE_PRESETS: dict[str, dict[str, Any]] = {
    "lightning-4step": dict(num_inference_steps=4, guidance_scale=1.0, scheduler="euler",
                            flow_shift=5.0, sigmas=(1.0, 0.75, 0.5, 0.25)),
}

__all__ = ["SAMPLE_DEFAULTS", "SAMPLE_PRESETS"]
