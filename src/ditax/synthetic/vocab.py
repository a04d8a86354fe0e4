"""The fixed vocabulary of the synthetic "bright object moves" task (issue 12).

Every clip shows one filled object of one colour and shape moving in one direction; its
canonical caption is ``a {colour} {shape} moves {direction}``. Five combinations are held out
of training entirely so that following an unseen prompt measures composition. The colours,
shapes, directions and held-out set are fixed: generator, scorer, benchmark and tests all
read them from here.

Directions are in image coordinates: ``up`` is towards row 0, ``right`` towards the last
column.
"""

from __future__ import annotations

import itertools
import re
from typing import NamedTuple

from ditax.errors import RequestError

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.8, 0.1),
    "blue": (0.15, 0.3, 0.95),
    "yellow": (0.95, 0.85, 0.1),
    "white": (0.95, 0.95, 0.95),
}
"""Colour name → RGB in [0, 1]; the object's interior is exactly this value."""

SHAPES: tuple[str, ...] = ("circle", "square")
DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")

DIRECTION_VECTORS: dict[str, tuple[int, int]] = {
    "left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}
"""Direction → unit step ``(dy, dx)`` in image coordinates (rows grow downwards)."""

PROMPT_TEMPLATE = "a {colour} {shape} moves {direction}"

PARAPHRASE_TEMPLATES: tuple[str, ...] = (
    "a {colour} {shape} moving {direction}",
    "the {colour} {shape} goes {direction}",
    "a {shape} coloured {colour} moves {direction}",
    "{colour} {shape}, moving {direction}, on a dark background",
)
"""Optional training captions besides the canonical one. :func:`parse_prompt` does not
accept them: the canonical form is the contract."""


class Combo(NamedTuple):
    """One (colour, shape, direction) combination of the vocabulary."""

    colour: str
    shape: str
    direction: str

    @property
    def prompt(self) -> str:
        """The canonical prompt, e.g. ``a red circle moves left``."""
        return PROMPT_TEMPLATE.format(**self._asdict())

    @property
    def rgb(self) -> tuple[float, float, float]:
        return COLOURS[self.colour]


HELD_OUT: tuple[Combo, ...] = (
    Combo("red", "square", "up"),
    Combo("green", "circle", "left"),
    Combo("blue", "square", "down"),
    Combo("yellow", "circle", "right"),
    Combo("white", "square", "left"),
)
"""Never in training data; used to measure composition."""


def all_combinations() -> list[Combo]:
    """All 40 combinations in vocabulary order (colour, then shape, then direction)."""
    return [Combo(*c) for c in itertools.product(COLOURS, SHAPES, DIRECTIONS)]


def seen_combinations() -> list[Combo]:
    """The 35 combinations that training data may contain."""
    return [c for c in all_combinations() if c not in HELD_OUT]


def held_out_combinations() -> list[Combo]:
    """The 5 held-out combinations (a list copy of :data:`HELD_OUT`)."""
    return list(HELD_OUT)


def is_held_out(combo) -> bool:
    return Combo(*combo) in HELD_OUT


def check_combo(colour: str, shape: str, direction: str) -> Combo:
    """``Combo`` of the three words; :class:`RequestError` naming any word not in the vocabulary."""
    for kind, word, allowed in (("colour", colour, COLOURS), ("shape", shape, SHAPES),
                                ("direction", direction, DIRECTIONS)):
        if word not in allowed:
            raise RequestError(f"{kind} {word!r} is not in the vocabulary; use one of "
                               f"{', '.join(allowed)}")
    return Combo(colour, shape, direction)


def canonical_prompt(colour: str, shape: str, direction: str) -> str:
    """``a {colour} {shape} moves {direction}`` after checking each word."""
    return check_combo(colour, shape, direction).prompt


def paraphrase(combo, index: int) -> str:
    """Caption of ``combo`` with paraphrase template ``index`` (mod the number of templates)."""
    c = Combo(*combo)
    return PARAPHRASE_TEMPLATES[index % len(PARAPHRASE_TEMPLATES)].format(**c._asdict())


_CANONICAL = re.compile(r"a (\w+) (\w+) moves (\w+)")


def parse_prompt(text: str) -> Combo:
    """Canonical prompt → ``Combo``. Case and surrounding / repeated spaces are ignored;
    anything else raises :class:`RequestError` with the expected form."""
    norm = " ".join(str(text).lower().split())
    m = _CANONICAL.fullmatch(norm)
    if m is None:
        raise RequestError(f"prompt {text!r} is not of the form {PROMPT_TEMPLATE!r} "
                           f"(e.g. {all_combinations()[0].prompt!r})")
    return check_combo(*m.groups())


__all__ = ["COLOURS", "SHAPES", "DIRECTIONS", "DIRECTION_VECTORS", "PROMPT_TEMPLATE",
           "PARAPHRASE_TEMPLATES", "HELD_OUT", "Combo", "all_combinations", "seen_combinations",
           "held_out_combinations", "is_held_out", "check_combo", "canonical_prompt",
           "paraphrase", "parse_prompt"]
