"""BFL's single-file FLUX.1 checkpoints (``flux1-dev.safetensors``) read as a diffusers folder.

Such a file holds the transformer under BFL's names (``img_in``, ``double_blocks.N.img_attn.qkv``
fused, ``single_blocks.N.linear1`` fused, ``final_layer.adaLN_modulation.1`` with its halves
swapped; :mod:`.original_names`), optionally prefixed ``model.diffusion_model.`` /
``diffusion_model.`` (ComfyUI), and no ``config.json``: the architecture comes from
``config=`` (a :class:`~ditax.models.flux.config.FluxConfig`; preset names and YAML paths are
read into one above the models, by ``ditax.load_transformer`` and ``ditax convert``).

The reading is FLUX.2's too (:class:`~ditax.models.common.bfl.single_file.BflSingleFile`):
:func:`open_single_file` checks the keys and shapes from the headers and returns the file
under diffusers' keys (:class:`BflWeights`); :func:`write_diffusers_folder` (``ditax convert
FILE --config NAME --out DIR``) writes it as a diffusers folder.
"""

from __future__ import annotations

from ditax.models.common.bfl.single_file import BflSingleFile, BflWeights, is_bfl
from ditax.models.common.single_files import key_prefix
from ditax.models.flux.config import FluxConfig
from ditax.models.flux.original_names import NAMES


def _hint(unexpected) -> str:
    return ("check config= (a FLUX.1 preset: flux.1-dev has the guidance embedding, "
            "flux.1-schnell not) and that the file downloaded completely")


SINGLE_FILE = BflSingleFile("ditax.models.flux", FluxConfig, "FLUX.1", "flux.1-dev", NAMES,
                            _hint)
single_file_config = SINGLE_FILE.config
open_single_file = SINGLE_FILE.open
check_single_file = SINGLE_FILE.check
write_diffusers_folder = SINGLE_FILE.write


__all__ = ["BflWeights", "SINGLE_FILE", "check_single_file", "is_bfl", "key_prefix",
           "open_single_file", "single_file_config", "write_diffusers_folder"]
