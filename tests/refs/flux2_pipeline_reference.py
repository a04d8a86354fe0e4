"""References for the FLUX.2 pipelines: diffusers' own preparation of a reference image (the
lines of ``Flux2Pipeline.__call__`` / ``Flux2KleinPipeline.__call__`` step 4, through its
``Flux2ImageProcessor``), and the tiny random pipeline folders (see below)."""

from __future__ import annotations

import numpy as np


def diffusers_reference_image(image, vae_scale_factor: int) -> np.ndarray:
    """diffusers' tensor ``[1, 3, H, W]`` (numpy) of one reference PIL ``image`` for a VAE of
    spatial factor ``vae_scale_factor`` (the pipeline's inline step 4)."""
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor

    proc = Flux2ImageProcessor(vae_scale_factor=vae_scale_factor * 2)
    proc.check_image_input(image)
    w, h = image.size
    if w * h > 1024 * 1024:
        image = proc._resize_to_target_area(image, 1024 * 1024)
        w, h = image.size
    m = vae_scale_factor * 2
    w, h = w // m * m, h // m * m
    return proc.preprocess(image, height=h, width=w, resize_mode="crop").numpy()


__all__ = ["diffusers_reference_image"]
