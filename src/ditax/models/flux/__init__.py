"""FLUX.1 (dev, schnell) text-to-image: the built-in family ``flux``.

Importing this package registers the family (:mod:`ditax.models.registry`'s discovery rule:
a subpackage of ``ditax.models`` whose ``__init__`` registers a spec): its one declaration,
naming every part and capability. Everything is named by ``"module:Name"`` so this import
stays light (no JAX). Pipeline folders (``FluxPipeline``) load with :mod:`ditax.pipelines.flux`.
"""

from ditax.models.registry import FamilySpec, register

register(FamilySpec(
    name="flux",
    config="ditax.models.flux.config:FluxConfig",
    family="ditax.models.flux.family:FluxFamily",
    transformer_classes=("FluxTransformer2DModel",),
    pipeline_classes=("FluxPipeline",),
    pipelines="ditax.pipelines.flux.family:FluxPipelines",
    trainers={"vae": "ditax.train.flux.trainers:FluxVAETraining"},  # train-vae --family flux
    lora_names="ditax.models.flux.lora_names:LORA_NAMES",
    # no step_cache: its pipeline takes no cache= (ditax calibrate-cache refuses a Flux folder)
    capabilities=frozenset({"transformer", "single_file", "folder_check", "quantize", "lora",
                            "bench", "preprocess", "init_from", "train_vae"}),
    random_folders="ditax.recipes.random_flux:RANDOM",                # ditax init-random
))
