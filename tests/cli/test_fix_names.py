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
