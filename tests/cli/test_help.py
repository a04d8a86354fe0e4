"""Help that teaches (issue 23, class 10).

Every ``ditax COMMAND --help`` ends with two or three examples, and each example as printed
(line continuations included) is accepted by that command's own parser; ``ditax config``
lists every leaf key of the config dataclasses with its default, and the presets; the
top-level help and the README name every command.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

import pytest

from ditax.cli import COMMANDS, build_parser, main

ROOT = pathlib.Path(__file__).resolve().parents[2]


def help_text(capsys, *argv: str) -> str:
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def printed_examples(text: str) -> list[str]:
    """The command lines of the ``examples:`` block that ends ``text`` (``\\`` joined)."""
    assert "\nexamples:\n" in text, text[-600:]
    block = text.rsplit("\nexamples:\n", 1)[1]
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    assert all(line.startswith(("#", "ditax ")) or prev.endswith("\\")
               for prev, line in zip([""] + lines, lines)), block   # nothing after the examples
    joined = re.sub(r"\s*\\\n\s*", " ", "\n".join(lines))
    return [line for line in joined.splitlines() if line.startswith("ditax ")]


def leaf_keys(obj, prefix: str = "") -> set[str]:
    out = set()
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out |= leaf_keys(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) \
            else {prefix + f.name}
    return out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_help_ends_with_examples_its_parser_accepts(command, capsys):
    examples = printed_examples(help_text(capsys, command))
    assert 2 <= len(examples) <= 3, examples
    own = [line for line in examples if shlex.split(line)[1] == command]
    assert len(own) >= 2, examples                # (one may show a related command)
    for line in examples:
        argv = shlex.split(line)
        assert argv[0] == "ditax" and argv[1] in COMMANDS, line
        _, parser, _ = build_parser(argv[1])
        parser.parse_intermixed_args(argv[2:])        # raises UsageError if it does not fit


def test_the_top_level_help_and_the_readme_name_every_command(capsys):
    text = help_text(capsys)
    listed = re.findall(r"^    (\S+)", text, flags=re.M)
    assert set(COMMANDS) <= set(listed), listed
    for line in printed_examples(text.replace("examples (ditax COMMAND --help shows more):",
                                              "examples:")):
        argv = shlex.split(line)
        build_parser(argv[1])[1].parse_intermixed_args(argv[2:])
    readme = (ROOT / "README.md").read_text()
    [paragraph] = re.findall(r"^Command line: .*?(?:\n\n)", readme, flags=re.M | re.S)
    missing = [name for name in COMMANDS if f"`ditax {name}`" not in paragraph]
    assert not missing, f"README's command list lacks {missing}"


def run_config(capsys, *args: str) -> str:
    """``ditax config ARGS``'s stdout (in-process: ``python -m ditax.cli`` itself is tested in
    test_cli.py; a process per call here only paid interpreter and import start-up)."""
    capsys.readouterr()
    rc = main(["config", *args])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def shown_keys(text: str) -> dict[str, str]:
    return dict(re.findall(r"^  ([\w.]+) = (\S*)", text, flags=re.M))


def test_ditax_config_lists_every_key_with_its_default_and_the_presets(capsys):
    from ditax.config import PRESET_DIR, Config, to_dict
    from ditax.config.loader import flatten_keys

    text = run_config(capsys)
    shown = shown_keys(text)
    expected = leaf_keys(Config())
    assert expected <= set(shown), sorted(expected - set(shown))
    defaults = flatten_keys(to_dict(Config()))
    assert shown["checkpoint.every"] == str(defaults["checkpoint.every"])
    assert shown["checkpoint.keep"] == str(defaults["checkpoint.keep"])
    assert shown["mesh.fsdp"] == str(defaults["mesh.fsdp"])
    presets = text.split("\npresets", 1)[1]
    for preset in sorted(p.stem for p in PRESET_DIR.glob("*.yaml")):
        assert re.search(rf"^  {re.escape(preset)}\s", presets, flags=re.M), preset


def test_ditax_config_preset_shows_its_values_against_the_defaults(capsys):
    from ditax.config import load_config

    text = run_config(capsys, "tiny", "mesh.fsdp=8", "checkpoint.every=5")
    cfg = load_config("tiny", ["mesh.fsdp=8", "checkpoint.every=5"])
    assert re.search(r"^  checkpoint\.every = 5  \[100\]", text, flags=re.M), text
    assert re.search(rf"^  checkpoint\.keep = {cfg.checkpoint.keep}\s", text, flags=re.M)
    assert re.search(r"^  mesh\.fsdp = 8  \[-1\]", text, flags=re.M)
    assert re.search(rf"^  model\.num_layers = {cfg.model.num_layers}  \[30\]", text, flags=re.M)


def test_ditax_config_vae_lists_every_train_vae_key(capsys):
    from ditax.train.wan.vae_config import VAETrainConfig

    shown = shown_keys(run_config(capsys, "--vae"))
    expected = leaf_keys(VAETrainConfig())
    assert expected <= set(shown), sorted(expected - set(shown))
