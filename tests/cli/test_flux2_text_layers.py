"""FLUX.2's text-encoder layers as a ``model.`` key (issue 57 item 8): a folder whose text
encoder is shallower than its kind's default layers (klein: 9, 18, 27) is refused before any
weights with a choice of layers it has and the key that sets them; that key then loads it, and
a call's own bad layers get the same suggestion."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")

from flux2_pipeline_reference import write_flux2_pipeline  # noqa: E402

from ditax.errors import RequestError  # noqa: E402


@pytest.fixture(scope="module")
def shallow(tmp_path_factory):
    """A tiny klein base folder whose Qwen3 has 4 layers (3 x its width = the transformer's
    joint_attention_dim)."""
    root = tmp_path_factory.mktemp("flux2_shallow") / "klein"
    write_flux2_pipeline(root, "klein-base")
    return root


class Loaded(Exception):
    """Raised instead of loading: the command got past its checks."""


def _stop_at_load(monkeypatch, seen: dict):
    import ditax.pipelines.flux2.loading as loading

    def load_pipeline(path, **kw):
        seen.update(kw)
        raise Loaded()
    monkeypatch.setattr(loading, "load_pipeline", load_pipeline)


def test_a_shallow_text_encoder_is_refused_with_layers_it_has(shallow, monkeypatch, capsys):
    from ditax.cli import main

    seen: dict = {}
    _stop_at_load(monkeypatch, seen)
    base = ["generate", "--model", str(shallow), "--prompt", "a cat", "--height", "32",
            "--width", "32", "--steps", "1", "--no-progress", "--output",
            str(shallow.parent / "x.png")]
    assert main(base) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "(9, 18, 27)" in err and "hidden states 0..4" in err
    # the suggestion is a value the folder takes, with the key that sets it
    assert "model.text_encoder_out_layers=[1,2,3]" in err, err
    assert not seen                                         # refused before any weights
    main(base + ["model.text_encoder_out_layers=[1,2,3]"])    # past every check, to the load
    assert "Loaded" in capsys.readouterr().err
    assert tuple(seen["text_encoder_out_layers"]) == (1, 2, 3)


def test_the_key_sets_the_layers_and_a_bad_call_is_told_good_ones(shallow):
    import ditax

    pipe = ditax.load_pipeline(shallow, text_encoder_out_layers=(1, 2, 4))
    assert pipe.text_encoder_out_layers == (1, 2, 4)
    with pytest.raises(RequestError) as e:
        pipe.prepare("a cat", height=32, width=32, num_inference_steps=1,
                     text_encoder_out_layers=(9, 18, 27))
    msg = str(e.value)
    assert "text_encoder_out_layers=(1, 2, 3)" in msg and "model.text_encoder_out_layers" in msg
    assert msg.count("(9, 18, 27)") == 1 and len(msg.splitlines()) == 1


def test_the_config_key_is_checked():
    from ditax.config import load_config, validate
    from ditax.errors import ConfigError

    cfg = load_config("flux.2-klein-4b", ["model.text_encoder_out_layers=[-1,2,3]"])
    with pytest.raises(ConfigError, match=r"model.text_encoder_out_layers=\(-1, 2, 3\)"):
        validate(cfg, None)
