"""What FLUX.1's and FLUX.2's weight tables share (:mod:`ditax.models.flux.convert`,
:mod:`ditax.models.flux2.convert`): the two stacks' names, the RMSNorm gain rows and the
readings of a family's ``table(cfg)`` rows (:func:`table_readers`: the
:class:`~ditax.io.convert.Table` the loader reads with and the parameters' logical axes)."""

from __future__ import annotations

from ditax.io.convert import ID, Row, Table, logical_axes

DOUBLE, SINGLE = "transformer_blocks", "single_transformer_blocks"


def norm_rows(path, key, layers=None) -> list[Row]:
    """An RMSNorm's gain: our ``scale``, diffusers' ``weight``."""
    return [Row(path + ("scale",), key + ".weight", ID, ("norm",), layers=layers)]


def table_readers(table):
    """``(weight_table, param_axes)`` of a family's ``table(cfg)`` (its rows: our path, the
    diffusers key, the transform, the logical axes): the transformer's
    :class:`~ditax.io.convert.Table` for ``cfg``, and our parameter path → logical axis
    names (stacked blocks: a leading "layers")."""
    def weight_table(cfg) -> Table:
        return Table("transformer", tuple(table(cfg)), cfg.num_layers, (),
                     f"the config (num_layers={cfg.num_layers}, num_single_layers="
                     f"{cfg.num_single_layers}, guidance_embeds={cfg.guidance_embeds})")

    def param_axes(cfg) -> dict[tuple[str, ...], tuple]:
        return logical_axes(table(cfg))

    return weight_table, param_axes


__all__ = ["DOUBLE", "SINGLE", "norm_rows", "table_readers"]
