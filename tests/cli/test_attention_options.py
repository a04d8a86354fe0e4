"""Attention options on the command line: an option the chosen backend does not take ends
``ditax generate`` in one stderr line, exit 2, before anything loads (a real process, the
shipped demo model); ``ditax config`` lists every option key."""

import os
import subprocess
import sys

import pytest

from ditax.attention import registry
from ditax.cli.config import render
from ditax.demo import model_path
from xla_test_flags import xla_flags


def _ditax(*argv):
    env = dict(os.environ, JAX_PLATFORMS="cpu", DITAX_CACHE_DIR="none",
               XLA_FLAGS=xla_flags(1))
    env.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run([sys.executable, "-m", "ditax.cli", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("overrides,words", [
    (["attention.backend=xla", "attention.block_q=256"],
     ["attention backend 'xla' does not take option(s) ['block_q']; it takes none",
      "block_q=256 applies to backends splash, flash"]),
    (["attention.backend=ulysses", "attention.fused_bwd=true"],
     ["attention backend 'ulysses' does not take option(s) ['fused_bwd']; it takes ['block_kv', "
      "'block_q', 'interpret', 'local', 'out_a2a'] (with local='xla')", "backend splash"]),
])
def test_generate_refuses_an_option_the_backend_does_not_take(overrides, words):
    res = _ditax("generate", "--model", model_path(), "--prompt", "x", *overrides)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("ditax generate: error: attention backend "), lines
    for w in words:
        assert w in lines[0], lines
    assert "compile cache" not in res.stdout       # refused before anything ran


def test_config_listing_shows_every_option_key():
    listing = render()
    for option in registry.option_vocabulary():
        assert f"  attention.{option} = " in listing, option
    assert "attention.fused_bwd = none" in listing and "splash" in listing
