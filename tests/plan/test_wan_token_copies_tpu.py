"""Wan 1.3B's 480p tokens padded once per forward, compiled for a TPU v5e without one (libtpu,
deviceless; ``ditax plan --compile``, two layers): the hidden state runs at 32,768 tokens (8
copies of the first ones) and no q / k / v is ever at the 32,760 real tokens in the layers'
head-major form, so no layer pads them (the chip's profile: 4 x 9.2 ms a forward). With
``attention.padded_keys=mask`` (no copies) the 32,760-token q / k / v are back. Slow tier:
two compiles of ~45 s each here."""

import contextlib
import importlib.util
import io
import re

import jax
import pytest

from ditax.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f'libtpu is not installed: pip install "jax[tpu]=={jax.__version__}" '
           f'(deviceless TPU compile)')]


def _hlo(tmp_path, *overrides) -> str:
    hlo = tmp_path / "forward.hlo"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["plan", "wan2.1-t2v-1.3b", "--target", "tpu-v5e-1", "--compile",
                   "--dump-hlo", str(hlo), "--latent", "21,60,104", "model.dtype=bfloat16",
                   "attention.backend=splash", "model.num_layers=2", "compile_cache=none",
                   *overrides])
    assert rc == 0, err.getvalue()[-800:]
    return hlo.read_text()


def _count(hlo: str, shape: str) -> int:
    return len(re.findall(re.escape(shape), hlo))


def test_wan_480p_tokens_padded_once_for_a_v5e(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")
    copies = _hlo(tmp_path)
    assert _count(copies, "bf16[1,32768,1536]") > 0                 # the hidden state
    assert _count(copies, "12,32760,128]") == 0                      # no real-length q / k / v
    masked = _hlo(tmp_path, "attention.padded_keys=mask")
    assert _count(masked, "bf16[1,32768,1536]") == 0
    assert _count(masked, "12,32760,128]") > 0                       # padded in every layer
