"""CLIP ViT image encoder of Wan 2.1 image-to-video / first-last-frame, and its preprocessing;
CLIP text encoder of FLUX.1 (its pooled vector).

``load_image_encoder(folder)`` reads a transformers ``CLIPVisionModel(WithProjection)`` folder
(or a pipeline's ``image_encoder/``), ``load_image_processor(folder)`` its
``image_processor/preprocessor_config.json``; ``encode_image(encoder, images, processor)``
gives the penultimate hidden states ``[B, 257, 1280]`` Wan's transformer conditions on.
``load_clip_text(folder)`` reads a FLUX.1 folder's ``text_encoder/`` (``CLIPTextModel``) and
``tokenizer/``; ``encode_clip_pooled(tokenizer, encoder, prompts)`` gives the pooled ``[B, 768]``.
"""

import importlib

# name -> its module; imported on first use, so that importing the package (the family
# registry's discovery imports every subpackage of ditax.models) does not start JAX
_HOMES = {
    "encoder": ("ACTIVATIONS", "CLIPVisionConfig", "CLIPVisionEncoder"),
    "loading": ("encode_image", "load_image_encoder", "weight_table"),
    "text": ("CLIPTextConfig", "CLIPTextEncoder"),
    "text_loading": ("encode_clip_pooled", "load_clip_text", "load_clip_text_encoder",
                     "text_weight_table"),
    "preprocess": ("CLIPImageProcessorConfig", "load_image_processor", "preprocess_image",
                   "preprocess_images"),
}
_MODULE = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name):
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)


__all__ = ["ACTIVATIONS", "CLIPVisionConfig", "CLIPVisionEncoder", "CLIPImageProcessorConfig",
           "encode_image", "load_image_encoder", "load_image_processor", "preprocess_image",
           "preprocess_images", "weight_table", "CLIPTextConfig", "CLIPTextEncoder",
           "encode_clip_pooled", "load_clip_text", "load_clip_text_encoder", "text_weight_table"]
