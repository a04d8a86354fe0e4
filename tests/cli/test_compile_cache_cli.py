"""``ditax train``, ``ditax bench`` and ``ditax plan`` compile inside jax's persistent
compilation cache with the same rules as ``ditax generate`` (:mod:`ditax.compile_cache`):
``compile_cache=PATH`` or ``DITAX_CACHE_DIR`` says where, ``none`` turns it off. Each command
runs in-process on the tiny preset; what it compiled must appear as files in the folder (and
nothing with ``none``), and jax's settings must be back afterwards."""

import jax
import pytest

from ditax.cli import main

pytestmark = pytest.mark.usefixtures("fast_compile")

TINY = ["model.num_layers=1", "sample.max_sequence_length=8"]


def _programs(folder):
    return sorted(p.name for p in folder.rglob("*-cache")) if folder.exists() else []


def _settings():
    return (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache)


@pytest.mark.parametrize("command", [
    ["plan", "tiny", "--compile", "--latent", "1,4,4", "--json"],
    # steps=0: the model is built and sharded (jitted), no training step
    ["train", "tiny", "steps=0", "batch_size=8", "data.num_frames=1", "data.height=16",
     "data.width=16", "data.text_len=8", "--no-progress"],
], ids=["plan", "train"])
def test_command_compiles_into_the_cache(command, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DITAX_CACHE_DIR", raising=False)
    before = _settings()
    folder = tmp_path / "key"
    assert main([*command, *TINY, f"output_dir={tmp_path / 'run'}",
                 f"compile_cache={folder}"]) == 0, capsys.readouterr().err
    assert _programs(folder), f"{command[0]} wrote no compiled program to {folder}"
    assert _settings() == before


def test_bench_follows_the_cache_rules(tmp_path, monkeypatch, capsys):
    """The config key, ``DITAX_CACHE_DIR`` and ``none``, as for ``ditax generate``."""
    command = ["bench", "tiny", "--latent", "1,4,4", "--text-len", "8", "--repeats", "1", *TINY]
    monkeypatch.delenv("DITAX_CACHE_DIR", raising=False)
    before = _settings()
    assert main([*command, f"compile_cache={tmp_path / 'key'}"]) == 0, capsys.readouterr().err
    written = _programs(tmp_path / "key")
    assert any(name.startswith("jit_") for name in written), written
    monkeypatch.setenv("DITAX_CACHE_DIR", str(tmp_path / "env"))
    assert main(command) == 0, capsys.readouterr().err
    # (programs still in this process's memory are not compiled again, so not written again;
    # what is compiled again goes to the variable's folder)
    assert _programs(tmp_path / "env")
    monkeypatch.setenv("DITAX_CACHE_DIR", str(tmp_path / "unused"))
    assert main([*command, "compile_cache=none"]) == 0, capsys.readouterr().err
    assert not _programs(tmp_path / "unused")
    assert _settings() == before
