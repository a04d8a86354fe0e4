"""Checks of a generation request (prompt, size, frames, steps, guidance) that need no model.

Sizes must be multiples of ``spatial`` = VAE spatial factor × transformer patch (16 for Wan) and
frame counts of the form ``temporal·k + 1`` (``temporal`` = VAE temporal factor, 4 for Wan).
The defaults come from the default Wan configs; a loaded pipeline passes its own components'.

Seeds follow the rule of :mod:`ditax.pipelines.seeds` (ints in ``[0, 2**32)``).
"""

from __future__ import annotations

import numpy as np

from ditax.errors import RequestError
from ditax.intmath import INT_LIMIT
from ditax.models.wan.config import ModelConfig
from ditax.models.vae.wan.config import WanVAEConfig
from ditax.pipelines.seeds import check_seed

_VAE = WanVAEConfig()
SPATIAL = _VAE.spatial_factor * ModelConfig().patch_size[1]  # 16: pixels per latent token
TEMPORAL = _VAE.temporal_factor                               # 4: frames per latent frame


def check_request(prompt, height: int, width: int, num_frames: int, num_inference_steps: int,
                  guidance_scale: float, guidance_scale_2: float | None = None,
                  negative_prompt=None, spatial: int = SPATIAL, temporal: int = TEMPORAL,
                  seed=0) -> None:
    """Raise :class:`RequestError` (a ``ValueError``) naming the bad value and the fix."""
    check_seed(seed)
    if not isinstance(prompt, str):
        raise RequestError(f"prompt must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise RequestError("prompt is empty; pass a text describing the video, e.g. "
                           "--prompt 'a cat walks on the grass'")
    if negative_prompt is not None and not isinstance(negative_prompt, str):
        raise RequestError(f"negative_prompt must be a string or None, got "
                           f"{type(negative_prompt).__name__}")
    for name, v in (("height", height), ("width", width), ("num_frames", num_frames),
                    ("num_inference_steps", num_inference_steps),
                    ("guidance_scale", guidance_scale), ("guidance_scale_2", guidance_scale_2)):
        if isinstance(v, (bool, np.bool_)):      # True is an int to Python, not a size
            raise RequestError(f"{name}={v!r} must be a number, not a boolean")
        if isinstance(v, (int, np.integer)) and not v < INT_LIMIT:       # no int32 overflow
            raise RequestError(f"{name}={v} is out of range; it must be below 2**31")
    for name, v in (("height", height), ("width", width)):
        if not isinstance(v, (int, np.integer)) or v < spatial or v % spatial:
            lo = max(spatial, (int(v) // spatial) * spatial) if isinstance(v, (int, np.integer)) else spatial
            raise RequestError(f"{name}={v!r} must be a positive multiple of {spatial} "
                               f"(VAE factor × patch); use e.g. {lo} or {lo + spatial}")
    if not isinstance(num_frames, (int, np.integer)) or num_frames < 1 or num_frames % temporal != 1:
        n = int(num_frames) if isinstance(num_frames, (int, np.integer)) else 1
        k = max(0, (n - 1) // temporal)
        raise RequestError(f"num_frames={num_frames!r} must be of the form {temporal}k+1 "
                           f"(1, {temporal + 1}, {2 * temporal + 1}, ...); use {temporal * k + 1} "
                           f"or {temporal * (k + 1) + 1}")
    if not isinstance(num_inference_steps, (int, np.integer)) or num_inference_steps < 1:
        raise RequestError(f"num_inference_steps={num_inference_steps!r} must be an integer >= 1")
    for name, g in (("guidance_scale", guidance_scale), ("guidance_scale_2", guidance_scale_2)):
        if g is None and name == "guidance_scale_2":
            continue
        if not isinstance(g, (int, float, np.floating, np.integer)) or not np.isfinite(g) or g < 0:
            raise RequestError(f"{name}={g!r} must be a finite number >= 0 (1 = no guidance, "
                               f"Wan uses 5.0)")


def check_grid(height: int, width: int, num_frames: int, rope_max_seq_len: int,
               spatial: int = SPATIAL, temporal: int = TEMPORAL, patch_t: int = 1) -> None:
    """The latent token grid of a (checked) request fits the transformer's 3-D RoPE table:
    at most ``rope_max_seq_len`` tokens along frames, height and width (Wan: 1024, i.e.
    16384 pixels a side). Checked before any weights load or anything compiles, with the
    flag to lower; else the RoPE table fails only while the first step compiles."""
    axes = (("--frames", num_frames, (num_frames - 1) // temporal // patch_t + 1,
             temporal * patch_t, 1),
            ("--height", height, height // spatial, spatial, 0),
            ("--width", width, width // spatial, spatial, 0))
    for flag, value, tokens, per_token, extra in axes:
        if tokens > rope_max_seq_len:
            most = (rope_max_seq_len - extra) * per_token + extra
            raise RequestError(f"{flag} {value} makes {tokens} latent tokens along that axis, "
                               f"more than the transformer's rope_max_seq_len="
                               f"{rope_max_seq_len}; use {flag} {most} or less")


def check_max_sequence_length(value, error=RequestError) -> None:
    """``max_sequence_length`` (prompt tokens kept) is None (the folder's) or an int >= 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                              or not 1 <= value < INT_LIMIT):
        raise error(f"max_sequence_length={value!r} must be a positive int (Wan: 512)")


def check_load_args(mesh, max_sequence_length, model_overrides: dict) -> None:
    """``load_pipeline``'s own arguments, checked before any file is read: ``mesh`` a
    ``jax.sharding.Mesh`` with ditax's axes (or None), ``max_sequence_length`` (see
    :func:`check_max_sequence_length`), ``model_overrides`` fields of the model config."""
    from ditax.errors import ConfigError
    from ditax.models.wan.config import check_overrides
    from ditax.parallel.mesh import check_mesh_axes

    check_mesh_axes(mesh)
    check_max_sequence_length(max_sequence_length, ConfigError)
    check_overrides(ModelConfig, model_overrides)


__all__ = ["SPATIAL", "TEMPORAL", "check_grid", "check_load_args", "check_max_sequence_length",
           "check_request"]
