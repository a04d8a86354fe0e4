"""BFL's single-file FLUX.2 checkpoints (``flux2-dev.safetensors``, ``flux-2-klein-4b.safetensors``)
read as a diffusers folder.

Such a file holds the transformer under BFL's names (:mod:`.original_names`, the map of
diffusers' ``convert_flux2_transformer_checkpoint_to_diffusers``): ``img_in``,
``double_blocks.N.img_attn.qkv`` / ``txt_attn.qkv`` fused (q, k, v stacked along the output:
diffusers' ``to_q``, ``to_k``, ``to_v`` / ``add_*_proj``), ``single_blocks.N.linear1`` (the
parallel block's input, the same tensor as diffusers' ``attn.to_qkv_mlp_proj``: q, k, v, then
the SwiGLU gate and value), ``final_layer.adaLN_modulation.1`` with its halves swapped (BFL's
shift, scale; diffusers' scale, shift), RMSNorm gains as ``.scale``; optionally under
``model.diffusion_model.`` / ``diffusion_model.`` (ComfyUI). There is no ``config.json``: the
architecture comes from ``config=``, a :class:`~ditax.models.flux2.config.Flux2Config` (the
``flux.2-dev`` / ``flux.2-klein-4b`` / ``flux.2-klein-9b`` presets or a YAML; names and paths
are read into one above the models). A file under diffusers' own names reads too.

:func:`open_single_file` checks the file's keys and shapes against the config from the headers
alone and returns the file under the diffusers keys of :mod:`.convert`'s table
(:class:`BflWeights`), so the loader's strict checks, sharded reads, merged LoRAs and 8-bit
quantization are the folders' own (:data:`LOADER`); :func:`write_diffusers_folder` (``ditax
convert FILE --config NAME --out DIR``) writes the file as a diffusers
``Flux2Transformer2DModel`` folder after the same checks. The reading is FLUX.1's too
(:class:`~ditax.models.common.bfl.single_file.BflSingleFile`).
"""

from __future__ import annotations

import dataclasses

from ditax.models.common.bfl.single_file import BflSingleFile, BflWeights, is_bfl
from ditax.models.flux2 import loading
from ditax.models.flux2.config import Flux2Config
from ditax.models.flux2.original_names import NAMES

# keys only FLUX.1's BFL files have: the likeliest wrong file for a FLUX.2 config
_FLUX1_MARKS = ("vector_in.", ".img_mod.lin.", ".txt_mod.lin.", ".modulation.lin.")


def _hint(unexpected) -> str:
    """The fix of a file that does not fit the config."""
    if any(m in k for k in unexpected for m in _FLUX1_MARKS):
        return ("the file has FLUX.1 keys (vector_in / img_mod / modulation.lin): it is a "
                "FLUX.1 checkpoint; load it with a FLUX.1 config (config='flux.1-dev')")
    return ("check config= (the file's model: flux.2-dev has the guidance embedding, "
            "flux.2-klein-4b / flux.2-klein-9b not; or a YAML of its architecture) and that "
            "the file downloaded completely")


SINGLE_FILE = BflSingleFile("ditax.models.flux2", Flux2Config, "FLUX.2", "flux.2-klein-4b",
                            NAMES, _hint)
single_file_config = SINGLE_FILE.config
open_single_file = SINGLE_FILE.open
check_single_file = SINGLE_FILE.check
write_diffusers_folder = SINGLE_FILE.write

#: the FLUX.2 transformer loader (:data:`ditax.models.flux2.loading.LOADER`) reading single
#: files with ``config=``
LOADER = dataclasses.replace(loading.LOADER, single_file_config=single_file_config,
                             open_weights=SINGLE_FILE.open_weights)


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str | None = "transformer",
                     **kwargs) -> loading.Flux2TransformerModel:
    """Load a FLUX.2 transformer from one ``.safetensors`` file (BFL's names or diffusers')
    with ``config=`` a :class:`Flux2Config` (``ditax.load_transformer``: also a preset name
    such as ``"flux.2-klein-4b"`` or a YAML path), or a folder as
    :func:`ditax.models.flux2.loading.load_transformer`; every argument is the one loader's
    (:meth:`ditax.models.common.loader.TransformerLoader.load`)."""
    return LOADER.load(path, dtype, mesh, attention, subfolder, **kwargs)


__all__ = ["BflWeights", "LOADER", "SINGLE_FILE", "check_single_file", "is_bfl",
           "load_transformer", "open_single_file", "single_file_config",
           "write_diffusers_folder"]
