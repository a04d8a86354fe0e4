"""The front door (:mod:`ditax.front`): one plain mapping → one frozen request, the same for the
CLI's flags, the server's JSON and a library call; nothing below the CLI sees argparse."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import numpy as np
import pytest

import ditax
from ditax import front
from ditax.demo import model_path
from ditax.errors import RequestError

SRC = pathlib.Path(ditax.__file__).parent
ASK = {"prompt": "a red ball rolls right", "num_inference_steps": 3, "guidance_scale": 2.5,
       "seed": 7, "height": 64, "width": 64, "num_frames": 9}


def test_cli_server_and_library_make_the_same_request(tmp_path):
    """The same values through ``ditax generate``'s flags, a server's JSON body and a library
    mapping resolve to the same call and the same load request."""
    from ditax.cli import build_parser
    from ditax.cli.generate import parse_request
    from ditax.serve.requests import check_body

    _, parser, _ = build_parser("generate")
    args = parser.parse_intermixed_args(
        ["--model", "demo", "--prompt", ASK["prompt"], "--steps", "3", "--guidance", "2.5",
         "--seed", "7", "--height", "64", "--width", "64", "--frames", "9",
         "--output", str(tmp_path / "o.mp4"), "sample.cfg_mode=sequential"])
    cli = parse_request(args)
    lib = front.resolve("demo", ["sample.cfg_mode=sequential"],
                        {**ASK, "output": str(tmp_path / "o.mp4")})
    body = {k: v for k, v in ASK.items() if k not in ("height", "width")}
    api = check_body({**body, "size": "64x64"}, str(model_path()), ["sample.cfg_mode=sequential"],
                     str(tmp_path / "o.mp4"))
    assert dict(cli.call) == dict(lib.call) == api.call
    assert cli.load == lib.load == api.load
    assert lib.load.path == str(model_path()) and lib.load.cfg_mode == "sequential"
    assert lib.output.path == str(tmp_path / "o.mp4") and lib.output.fps == 16
    # every default resolved once: the call holds the folder's text length, no None size
    assert lib.load.family["max_sequence_length"] == 16
    assert None not in (lib.call["height"], lib.call["num_frames"], lib.call["guidance_scale"])


def test_the_request_is_frozen():
    req = front.resolve("demo", [], {"prompt": "a cat"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.load.dtype = "bfloat16"
    with pytest.raises(TypeError):
        req.call["seed"] = 3
    with pytest.raises(TypeError):
        req.load.family["flow_shift"] = 1.0
    call = req.kwargs()       # a fresh dict each time: the caller's to change
    call["seed"] = 3
    assert req.call["seed"] == 0


@pytest.mark.parametrize("given, surface, words", [
    ({"upsampler": "x"}, "cli", ("--upsampler is not taken by wan models", "ltx2")),
    ({"upsampler": "x"}, "api", ("upsampler is not taken by wan models",)),
    ({"true_cfg_scale": 4.0}, "cli", ("--true-cfg is not taken by wan models", "flux")),
    ({"colour": "red"}, "python", ("colour is not a request field, input or option of wan",)),
    ({"num_frames": 18}, "api", ("num_frames",)),
    ({"num_inference_steps": True}, "api", ("num_inference_steps=true must be a number",)),
])
def test_a_name_or_value_the_family_does_not_take_is_one_line(given, surface, words):
    with pytest.raises(RequestError) as e:
        front.resolve("demo", [], {"prompt": "a cat", **given}, surface)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_open_loads_what_the_request_names_and_runs_it():
    """``front.open`` (preflight, run context, load) gives the pipeline ``load_pipeline``
    gives: the same video for the request's call."""
    req = front.resolve("demo", [], {**ASK, "num_inference_steps": 2, "num_frames": 5},
                        say=lambda line: None)
    with front.open(req.load, req.call, progress=False, say=lambda line: None) as pipe:
        video = pipe(progress=False, **req.kwargs())
    direct = ditax.load_pipeline(str(model_path()))(progress=False, **req.kwargs())
    assert video.shape == (5, 64, 64, 3)
    np.testing.assert_array_equal(np.asarray(video), np.asarray(direct))


def _imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_nothing_below_the_cli_imports_argparse_or_the_cli():
    """front/, pipelines/ and serve/ read plain mappings: no argparse, no ditax.cli (so the
    server's import graph hides no dependency on the command line)."""
    bad = [(str(f.relative_to(SRC)), m) for room in ("front", "pipelines", "serve")
           for f in (SRC / room).rglob("*.py") for m in _imports(f)
           if m == "argparse" or m == "ditax.cli" or m.startswith("ditax.cli.")]
    assert bad == []


def test_family_hooks_take_the_mapping_not_args():
    """No family's request hook takes an argparse ``args``: their first argument is the
    request's mapping (``given``)."""
    import inspect

    from ditax.pipelines.family import known_pipelines

    seen = 0
    for _, pipes in known_pipelines():
        for hook in ("read_inputs", "sample_options"):
            params = list(inspect.signature(getattr(pipes, hook)).parameters)
            assert params[0] == "given" and "args" not in params, (pipes.name, hook, params)
            seen += 1
        for i in pipes.inputs:         # inputs are data the CLI turns into flags
            assert i.name in pipes.cli_inputs, (pipes.name, i.name)
    assert seen >= 8
