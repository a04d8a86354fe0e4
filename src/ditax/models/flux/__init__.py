"""FLUX.1 (dev, schnell) text-to-image: the built-in family ``flux``.

Importing this package registers the family (:mod:`ditax.models.registry`'s discovery rule:
a subpackage of ``ditax.models`` whose ``__init__`` registers a spec). Everything is named by
``"module:Name"`` so this import stays light (no JAX). The pipeline folders
(``FluxPipeline``) are not read yet: ``pipeline_classes`` is empty until the pipeline lands.
"""

from ditax.models.registry import FamilySpec, register

register(FamilySpec(
    name="flux",
    config="ditax.models.flux.config:FluxConfig",
    family="ditax.models.flux.family:FluxFamily",
    transformer_classes=("FluxTransformer2DModel",),
))
