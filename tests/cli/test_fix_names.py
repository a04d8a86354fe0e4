"""A fix names a real flag or key (issue 41, class 10): the flags a message tells the user to
pass exist on the command it is about, and ``ditax config`` refuses what ``ditax train``
refuses."""

import re

import numpy as np
import pytest

from ditax.cli import build_parser, main
from ditax.errors import RequestError


def flags_of(command: str) -> set[str]:
    _, parser, _ = build_parser(command)
    return set(parser._option_string_actions)


def test_vace_mask_without_video_names_generates_flag():
    from ditax.models.wan.vace_context import mask_frames

    with pytest.raises(RequestError) as e:
        mask_frames(np.ones((5, 16, 16), np.float32), 5, 16, 16, video=None)
    named = set(re.findall(r"--[a-z][a-z0-9-]*", str(e.value)))
    assert named and named <= flags_of("generate"), (named, str(e.value))


def test_config_refuses_what_train_refuses(capsys):
    rc = main(["config", "flux-tiny", "model.quantize=int8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "model.quantize=int8 is for inference" in err[0], err


def test_training_says_what_it_would_ignore(tmp_path, capsys):
    """Issue 41 class 7: lora.alpha without lora.rank is refused; lora.rank without init_from
    says in one line that the adapters train on a random base."""
    rc = main(["config", "tiny", "lora.alpha=8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "lora.alpha=8 scales LoRA adapters" in err[0], err
    assert main(["train", "tiny", "lora.rank=4", "steps=0", f"output_dir={tmp_path / 'run'}",
                 "--no-progress"]) == 0
    warned = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and "lora.rank=4 without init_from" in warned[0], warned


def _raised_texts():
    """Every string constant inside a ``raise`` statement of src/ditax (the messages' text)."""
    import ast
    import pathlib

    import ditax

    for f in pathlib.Path(ditax.__file__).parent.rglob("*.py"):
        for r in ast.walk(ast.parse(f.read_text())):
            if isinstance(r, ast.Raise):
                for node in ast.walk(r):
                    if isinstance(node, ast.Constant) and isinstance(node.value, str):
                        yield f"{f.name}:{r.lineno}", node.value


def test_every_flag_and_key_an_error_names_exists():
    """Class 10's walker: each ``--flag`` an error message names is a flag of some ditax
    command, and each ``section.key=`` it names is a key of the run config (any built-in
    family's, its variants') or of a family trainer's config."""
    from ditax.cli import COMMANDS
    from ditax.config.families import config_family
    from ditax.config.keys import key_types, leaf_types
    from ditax.models.base import family_class
    from ditax.models.registry import family_names, spec

    flags = set()
    for command in COMMANDS:
        flags |= set(flags_of(command))
    keys = set()
    for name in family_names():
        keys |= set(key_types(config_family(name).config))
        for variant in spec(name).variant_classes():
            keys |= set(key_types(variant))
        for kind in spec(name).trainers:
            keys |= set(leaf_types(family_class(name).trainer(kind).config_class))
    sections = {k.split(".")[0] for k in keys}
    bad = []
    for where, text in _raised_texts():
        bad += [(where, f) for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)
                if f not in flags]
        bad += [(where, k) for k in re.findall(r"(?<![\w.])([a-z_]+\.[a-z_0-9]+)(?==)", text)
                if k.split(".")[0] in sections and k not in keys]
    assert not bad, bad
