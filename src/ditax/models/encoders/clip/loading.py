"""CLIP image encoder weights (transformers format) ↔ :class:`CLIPVisionEncoder`; Wan's
``encode_image``.

Checkpoints name the vision tower ``vision_model.*`` (``CLIPVisionModelWithProjection``, the
Wan 2.1 I2V ``image_encoder/`` folders, transformers 4.x ``CLIPVisionModel``) or without that
prefix (transformers 5 ``CLIPVisionModel.save_pretrained``); both are read. The projection head
(``visual_projection``), a full CLIP model's text tower and the old ``position_ids`` buffer
are not used by Wan and are not read.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from ditax.io.convert import CONV2D, ID, TRANSPOSE, Row, Table, load_params
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.encoders.clip.encoder import CLIPVisionConfig, CLIPVisionEncoder
from ditax.models.encoders.clip.preprocess import CLIPImageProcessorConfig, preprocess_images

_PREFIX = "vision_model."

IGNORED = (r"^visual_projection\.", r"(^|\.)embeddings\.position_ids$", r"^text_model\.",
           r"^text_projection\.", r"^logit_scale$")


def tower_row(path: tuple[str, ...], key: str, transform=ID, prefix: str = _PREFIX) -> Row:
    """One row of a tower stored with (``prefix``: ``vision_model.`` / ``text_model.``) or
    without its prefix."""
    return Row(path, prefix + key, transform, alt=(key,))


def layer_rows(prefix: str = _PREFIX) -> list[Row]:
    """The stacked encoder layers' rows (attention, MLP, both norms), shared by both towers."""
    rows = []
    for mod, names in (("self_attn", ("q_proj", "k_proj", "v_proj", "out_proj")),
                       ("mlp", ("fc1", "fc2"))):
        for n in names:
            key = f"encoder.layers.{{i}}.{mod}.{n}"
            rows += [tower_row(("layers", mod, n, "kernel"), key + ".weight", TRANSPOSE, prefix),
                     tower_row(("layers", mod, n, "bias"), key + ".bias", ID, prefix)]
    for n in ("layer_norm1", "layer_norm2"):
        key = f"encoder.layers.{{i}}.{n}"
        rows += [tower_row(("layers", n, "scale"), key + ".weight", ID, prefix),
                 tower_row(("layers", n, "bias"), key + ".bias", ID, prefix)]
    return rows


def weight_table(cfg: CLIPVisionConfig) -> Table:
    """transformers CLIP vision keys ↔ our parameter paths (linears transposed, the patch
    convolution ``[D, C, p, p]`` → ``[p, p, C, D]``, layers stacked on a leading axis)."""
    emb = ("embeddings",)
    rows = [tower_row(emb + ("class_embedding",), "embeddings.class_embedding"),
            tower_row(emb + ("patch_embedding",), "embeddings.patch_embedding.weight", CONV2D),
            tower_row(emb + ("position_embedding",), "embeddings.position_embedding.weight")]
    for n in ("pre_layrnorm", "post_layernorm"):
        rows += [tower_row((n, "scale"), f"{n}.weight"), tower_row((n, "bias"), f"{n}.bias")]
    rows += layer_rows()
    return Table("CLIP image encoder", tuple(rows), cfg.num_hidden_layers, IGNORED,
                 f"its config (num_hidden_layers={cfg.num_hidden_layers}, hidden_size="
                 f"{cfg.hidden_size}, image_size={cfg.image_size}, patch_size={cfg.patch_size})")


def load_image_encoder(path, dtype="float32", attention: str = "xla") -> CLIPVisionEncoder:
    """Load a transformers ``CLIPVisionModel`` / ``CLIPVisionModelWithProjection`` folder (or a
    pipeline folder's ``image_encoder/``, or a hub id).

    Every tensor goes through :func:`weight_table` (key and shape checks) and is cast to
    ``dtype``; a mismatch raises one :class:`~ditax.errors.WeightError` naming the keys.
    """
    folder = resolve_folder(path, "image_encoder")
    cfg = CLIPVisionConfig.from_hf(read_model_json(folder / "config.json", "CLIP config"), dtype)
    abstract = nnx.eval_shape(lambda: CLIPVisionEncoder(cfg, rngs=nnx.Rngs(0),
                                                        attention=attention))
    graphdef, state = nnx.split(abstract)
    state = load_params(weight_table(cfg), Weights.open(folder), state, jnp.dtype(dtype))
    return nnx.merge(graphdef, state)


@nnx.jit
def _penultimate_jit(encoder: CLIPVisionEncoder, pixel_values):
    return encoder.penultimate(pixel_values)


def encode_image(encoder: CLIPVisionEncoder, images,
                 processor: CLIPImageProcessorConfig | None = None,
                 floats: str = "unit") -> jax.Array:
    """Images → image embeddings ``[B, 1 + patches, D]`` as Wan's pipeline builds them
    (``CLIPImageProcessor``, then the penultimate hidden states).

    ``images``: one image or a list (first and last frame for FLF2V); see
    :func:`~ditax.models.encoders.clip.preprocess.preprocess_images` for the accepted kinds and
    ``floats``.
    """
    pixels = preprocess_images(images, processor or CLIPImageProcessorConfig(), floats=floats)
    return _penultimate_jit(encoder, pixels)
