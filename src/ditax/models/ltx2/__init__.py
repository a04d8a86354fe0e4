"""LTX-2 / LTX-2.3 audio+video generation: the built-in family ``ltx2``.

Importing this package registers the family (:mod:`ditax.models.registry`'s discovery rule):
its one declaration, naming every part and capability. Everything is named by
``"module:Name"`` so this import stays light (no JAX). So far the family has its transformer
(``LTX2VideoTransformer3DModel`` folders, :mod:`ditax.models.ltx2.transformer.loading`) and the
``ditax convert`` folder check, its text-to-video-with-sound pipelines (``LTX2Pipeline``
folders, :mod:`ditax.pipelines.ltx2`), training on both streams (``ditax preprocess`` with the
folder's encoders, ``init_from``, LoRA: :mod:`ditax.models.ltx2.training`) and LoRA loading.
"""

from ditax.models.registry import FamilySpec, register

register(FamilySpec(
    name="ltx2",
    config="ditax.models.ltx2.config:LTX2Config",
    family="ditax.models.ltx2.family:LTX2Family",
    transformer_classes=("LTX2VideoTransformer3DModel",),
    pipeline_classes=("LTX2Pipeline", "LTX2ImageToVideoPipeline",
                      "LTX2LatentUpsamplePipeline"),
    pipelines="ditax.pipelines.ltx2.family:LTX2Pipelines",
    lora_names="ditax.models.ltx2.lora_names:LORA_NAMES",
    capabilities=frozenset({"transformer", "single_file", "folder_check", "quantize", "lora",
                            "bench", "preprocess", "init_from", "step_cache"}),
    random_folders="ditax.recipes.random_ltx2:RANDOM",                # ditax init-random
))
