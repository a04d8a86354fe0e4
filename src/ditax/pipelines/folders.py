"""What the families' loaders read and check first, before any weights: the load options every
pipeline takes, the folder's pipeline class and component folders, and its flow-match Euler
scheduler.

Each is one :class:`~ditax.errors.ConfigError` line naming the folder (or the value), what is
wrong and the fix; the family passes its own names (``"FLUX.2"``, its classes and
components).
"""

from __future__ import annotations

import pathlib

from ditax.errors import ConfigError
from ditax.pipelines.options import check_cfg_mode


def check_load_options(cfg_mode, model_overrides: dict, one_transformer: str | None = None
                       ) -> None:
    """The load options every family checks before a file is read: ``cfg_mode``
    (:func:`~ditax.pipelines.options.check_cfg_mode`) and, for a family whose folders hold one
    transformer (``one_transformer``: how its folder is named, e.g. ``"a FLUX.2 folder"``),
    no LoRAs for a second expert (``loras_2`` taken out of ``model_overrides``)."""
    check_cfg_mode(cfg_mode)
    if one_transformer is not None and model_overrides.pop("loras_2", None):
        raise ConfigError(f"loras_2= / --lora-2 are for a second expert; {one_transformer} has "
                          f"one transformer: give its LoRAs with loras= / --lora")


def read_index(root) -> dict:
    """Folder ``root``'s ``model_index.json`` (``{}`` when it holds no object)."""
    from ditax.io.files import read_model_json

    index = read_model_json(pathlib.Path(root) / "model_index.json", "model_index.json")
    return index if isinstance(index, dict) else {}


def folder_class(root, classes: tuple[str, ...], loader: str,
                 components: tuple[str, ...] = ()) -> tuple[str, dict]:
    """``(class, model_index.json)`` of pipeline folder ``root``: its ``_class_name`` one of
    ``classes`` (the ``loader``'s, e.g. ``"FLUX.2"``), and each of ``components`` a folder in
    it."""
    root = pathlib.Path(root)
    index = read_index(root)
    cls = index.get("_class_name")
    if cls not in classes:
        raise ConfigError(f"{root}: model_index.json _class_name={cls!r}; the {loader} loader "
                          f"reads {list(classes)} folders")
    missing = [c for c in components if not (root / c).is_dir()]
    if missing:
        raise ConfigError(f"{root} lacks {', '.join(m + '/' for m in missing)}: a {cls} folder "
                          f"holds {', '.join(c + '/' for c in components)} (save it with "
                          f"diffusers' {cls}.save_pretrained)")
    return cls, index


def euler_scheduler(root, family: str):
    """The folder's ``scheduler/`` as a
    :class:`~ditax.schedulers.flow_match.FlowMatchEulerScheduler` (``family``, e.g.
    ``"LTX-2"``, samples with nothing else)."""
    from ditax.schedulers import FlowMatchEulerScheduler, load_scheduler

    root = pathlib.Path(root)
    try:
        scheduler = load_scheduler(root)
    except ValueError as e:
        raise ConfigError(f"{root / 'scheduler'}: {e}") from None
    if not isinstance(scheduler, FlowMatchEulerScheduler):
        raise ConfigError(f"{root / 'scheduler'}: {family} samples with "
                          f"FlowMatchEulerDiscreteScheduler; got {type(scheduler).__name__}")
    return scheduler


__all__ = ["check_load_options", "euler_scheduler", "folder_class", "read_index"]
