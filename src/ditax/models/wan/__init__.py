"""Wan 2.1 / 2.2 (text-, image-, text-image-to-video): the built-in family ``wan``.

Importing this package registers the family (:mod:`ditax.models.registry`'s discovery rule:
a subpackage of ``ditax.models`` whose ``__init__`` registers a spec): its one declaration,
naming every part and capability. Everything is named by
``"module:Name"`` so this import stays light (no JAX).
"""

from ditax.models.registry import FamilySpec, register

register(FamilySpec(
    name="wan",
    config="ditax.models.wan.config:ModelConfig",
    family="ditax.models.wan.family:WanFamily",
    transformer_classes=("WanTransformer3DModel", "WanVACETransformer3DModel",
                         "WanAnimateTransformer3DModel"),
    pipeline_classes=("WanPipeline", "WanImageToVideoPipeline", "WanVACEPipeline",
                      "WanAnimatePipeline", "WanVideoToVideoPipeline"),
    variants=("ditax.models.wan.animate:WanAnimateConfig",),   # VACE: WanConfig.vace_layers
    pipelines="ditax.pipelines.wan.family:WanPipelines",
    trainers={"vae": "ditax.train.wan.trainers:WanVAETraining"},       # ditax train-vae
    lora_names="ditax.models.wan.lora_names:LORA_NAMES",
    capabilities=frozenset({"transformer", "single_file", "folder_check", "quantize", "lora",
                            "step_cache", "bench", "preprocess", "init_from", "train_vae", "causal"}),
    random_folders="ditax.recipes.random_wan:RANDOM",                 # ditax init-random
))
