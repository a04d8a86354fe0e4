"""FLUX.1 (dev, schnell) text-to-image: the built-in family ``flux``.

Importing this package registers the family (:mod:`ditax.models.registry`'s discovery rule:
a subpackage of ``ditax.models`` whose ``__init__`` registers a spec). Everything is named by
``"module:Name"`` so this import stays light (no JAX). Pipeline folders (``FluxPipeline``)
load with :mod:`ditax.pipelines.flux`.
"""

from ditax.models.registry import FamilySpec, register

register(FamilySpec(
    name="flux",
    config="ditax.models.flux.config:FluxConfig",
    family="ditax.models.flux.family:FluxFamily",
    transformer_classes=("FluxTransformer2DModel",),
    pipeline_classes=("FluxPipeline",),
))
