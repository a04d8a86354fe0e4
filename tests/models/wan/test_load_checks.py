"""``ditax.load_transformer`` is an entry point: it checks the model config once, with every
rule the run config's ``validate`` applies to it, numbers included, before reading weights."""

import math

import pytest

import ditax
from ditax.errors import ConfigError
from wan_reference import make_diffusers_wan


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_diffusers_wan(tmp_path_factory.mktemp("wan"), layers=1)[1]


@pytest.mark.parametrize("override,msg", [
    (dict(eps=math.nan), r"model.eps=nan: expected a finite number"),
    (dict(eps=math.inf), r"model.eps=inf: expected a finite number"),
    (dict(rope_max_seq_len=2 ** 40), r"model.rope_max_seq_len=1099511627776 is out of range"),
])
def test_non_finite_or_huge_model_numbers_are_refused(folder, override, msg):
    with pytest.raises(ConfigError, match=msg):
        ditax.load_transformer(folder, **override)


def test_a_model_rule_is_checked_at_load(folder):
    with pytest.raises(ConfigError, match=r"attention.backend='nope'"):
        ditax.load_transformer(folder, attention="nope")
    assert ditax.load_transformer(folder).config.num_layers == 1
