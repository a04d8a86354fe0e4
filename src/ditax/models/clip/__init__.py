"""CLIP ViT image encoder of Wan 2.1 image-to-video / first-last-frame, and its preprocessing;
CLIP text encoder of FLUX.1 (its pooled vector).

``load_image_encoder(folder)`` reads a transformers ``CLIPVisionModel(WithProjection)`` folder
(or a pipeline's ``image_encoder/``), ``load_image_processor(folder)`` its
``image_processor/preprocessor_config.json``; ``encode_image(encoder, images, processor)``
gives the penultimate hidden states ``[B, 257, 1280]`` Wan's transformer conditions on.
``load_clip_text(folder)`` reads a FLUX.1 folder's ``text_encoder/`` (``CLIPTextModel``) and
``tokenizer/``; ``encode_clip_pooled(tokenizer, encoder, prompts)`` gives the pooled ``[B, 768]``.
"""

from ditax.models.clip.encoder import ACTIVATIONS, CLIPVisionConfig, CLIPVisionEncoder
from ditax.models.clip.loading import encode_image, load_image_encoder, weight_table
from ditax.models.clip.text import CLIPTextConfig, CLIPTextEncoder
from ditax.models.clip.text_loading import (encode_clip_pooled, load_clip_text,
                                            load_clip_text_encoder, text_weight_table)
from ditax.models.clip.preprocess import (CLIPImageProcessorConfig, load_image_processor,
                                          preprocess_image, preprocess_images)

__all__ = ["ACTIVATIONS", "CLIPVisionConfig", "CLIPVisionEncoder", "CLIPImageProcessorConfig",
           "encode_image", "load_image_encoder", "load_image_processor", "preprocess_image",
           "preprocess_images", "weight_table", "CLIPTextConfig", "CLIPTextEncoder",
           "encode_clip_pooled", "load_clip_text", "load_clip_text_encoder", "text_weight_table"]
