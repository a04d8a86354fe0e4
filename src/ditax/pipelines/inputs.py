"""A family's inputs beyond its request fields, declared as data: the files a request brings
(images, videos, a second model folder) and their knobs (a strength, a mode).

A family lists them (:attr:`~ditax.pipelines.family.PipelineFamily.inputs`); every entry reads
them by :attr:`Input.name` from the request's plain mapping (:func:`ditax.front.resolve`), and
the CLI alone turns them into flags (``ditax generate``: :attr:`Input.flag`, the aliases, the
help with the families that take the flag). Nothing here knows argparse.
"""

from __future__ import annotations

from dataclasses import dataclass

INPUT_KINDS = ("str", "int", "float")


@dataclass(frozen=True)
class Input:
    """One input: ``name`` (its key in a request's mapping; the flag is ``--name-with-dashes``),
    ``help``, ``kind`` (``str``: a path or a word; ``int``; ``float``), ``metavar``,
    ``aliases`` (further flags), ``repeat`` (given several times: a list), ``choices``."""

    name: str
    help: str
    kind: str = "str"
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    repeat: bool = False
    choices: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.kind not in INPUT_KINDS:
            raise TypeError(f"Input {self.name!r}: kind={self.kind!r} must be one of "
                            f"{INPUT_KINDS}")

    @property
    def flag(self) -> str:
        """The ``ditax generate`` flag."""
        return "--" + self.name.replace("_", "-")


__all__ = ["INPUT_KINDS", "Input"]
