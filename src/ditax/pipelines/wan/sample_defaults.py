"""Wan's own check of a folder's ``ditax_sample.json`` (read for every family by
:mod:`ditax.pipelines.sample_defaults`): its sizes, frames, steps and guidance fit Wan's grid."""

from __future__ import annotations

from ditax.errors import PipelineLoadError


def check_fits(values: dict, source, spatial: int, temporal: int) -> None:
    """The file's sizes fit the model's grid (``spatial`` pixels per token, frames
    ``temporal·k + 1``); else a :class:`PipelineLoadError` naming the file (``source``)."""
    from ditax.pipelines.wan.request import check_request

    try:
        check_request("x", values.get("height", spatial), values.get("width", spatial),
                      values.get("num_frames", 1), values.get("num_inference_steps", 1),
                      values.get("guidance_scale", 1.0), values.get("guidance_scale_2"),
                      spatial=spatial, temporal=temporal)
    except ValueError as e:
        raise PipelineLoadError(f"{source}: {e}") from None


__all__ = ["check_fits"]
