"""FLUX.2 (dev, klein 4B / 9B) text- and image-to-image: the built-in family ``flux2``.

Importing this package registers the family (:mod:`ditax.models.registry`'s discovery rule):
its one declaration, naming every part and capability. Everything is named by
``"module:Name"`` so this import stays light (no JAX). The transformer
(``Flux2Transformer2DModel`` folders: :mod:`ditax.models.flux2.loading`; BFL's single files:
:mod:`ditax.models.flux2.single_file`), its training
(:mod:`ditax.models.flux2.training`) and LoRA names are here; pipeline folders
(``Flux2Pipeline``, ``Flux2KleinPipeline``) load with :mod:`ditax.pipelines.flux2`.
"""

from ditax.models.registry import FamilySpec, register

register(FamilySpec(
    name="flux2",
    config="ditax.models.flux2.config:Flux2Config",
    family="ditax.models.flux2.family:Flux2Family",
    transformer_classes=("Flux2Transformer2DModel",),
    pipeline_classes=("Flux2Pipeline", "Flux2KleinPipeline"),
    pipelines="ditax.pipelines.flux2.family:Flux2Pipelines",
    lora_names="ditax.models.flux2.lora_names:LORA_NAMES",
    capabilities=frozenset({"transformer", "single_file", "folder_check", "quantize", "lora",
                            "bench", "init_from", "preprocess"}),
    random_folders="ditax.recipes.random_flux2:RANDOM",               # ditax init-random
))
