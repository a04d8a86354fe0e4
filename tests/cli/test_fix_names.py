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
