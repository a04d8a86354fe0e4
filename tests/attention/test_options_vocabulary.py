"""One vocabulary of attention options (the options classes): ``attend(**options)`` and the
``attention.<option>`` config keys refuse an option that none of the kernels a call runs
takes with the same one line; every option of every options class is a config key that
reaches its kernel (``attention.fused_bwd`` reaches splash, also as ulysses' local kernel);
the registry declares entry contexts."""

import dataclasses

import jax.numpy as jnp
import pytest

import ditax
from ditax.attention import attend, registry
from ditax.attention.config import OPTION_DEFAULTS, AttentionConfig, check_attention
from ditax.attention.options import OptionError
from ditax.attention.plan import entry_context, needs_entry_context, plan_attention, sites
from ditax.attention.sequence import plan_sequence_parallel
from ditax.config import load_config, validate
from ditax.errors import ConfigError

Q = jnp.zeros((1, 16, 2, 8), jnp.float32)

# a value for each option that differs from its config default and its class default
VALUES = {"block_q": 256, "block_kv": 384, "block_kv_compute": 128, "block_q_bwd": 256,
          "block_kv_bwd": 256, "fused_bwd": True, "interpret": True, "pad_head_dim": True,
          "padded_keys": "mask", "local": "blockwise", "out_a2a": "chunked",
          "ulysses_shards": 2, "quant_block": 64}


def _config_error(backend, **options) -> OptionError:
    with pytest.raises(OptionError) as e:
        check_attention(AttentionConfig(backend=backend, **options))
    return e.value


def _attend_error(backend, **options) -> OptionError:
    with pytest.raises(OptionError) as e:
        attend(Q, Q, Q, backend=backend, **options)
    return e.value


@pytest.mark.parametrize("backend,options", [
    ("xla", {"block_q": 256}),
    ("blockwise", {"block_q": 64}),
    ("flash", {"fused_bwd": True}),
    ("splash", {"local": "flash"}),
    ("cudnn", {"interpret": True}),
    ("reference", {"out_a2a": "chunked"}),
    ("ulysses", {"ulysses_shards": 2}),
    ("ring", {"fused_bwd": True}),                       # local xla takes no fused_bwd
    ("ulysses", {"local": "flash", "pad_head_dim": True}),
    ("ulysses_ring", {"local": "blockwise", "block_kv_bwd": 256}),
])
def test_config_and_attend_refuse_the_same_way(backend, options):
    """The same rule and the same words: a ConfigError (exit 2) and a TypeError, one line
    naming the backend, the refused options and the options it takes."""
    from_config, from_attend = _config_error(backend, **options), _attend_error(backend, **options)
    assert str(from_config) == str(from_attend)
    msg = str(from_config)
    assert isinstance(from_config, ConfigError) and isinstance(from_attend, TypeError)
    assert "\n" not in msg
    assert msg.startswith(f"attention backend {backend!r} does not take option(s) ")
    accepted = set(registry.takes(backend))
    if registry.get(backend).kind == "sequence":
        accepted |= set(registry.takes(options.get("local", "xla")))
    refused = sorted(set(options) - accepted)
    assert refused and f"{refused}; it takes {sorted(accepted) if accepted else 'none'}" in msg


def test_the_cli_words_name_backend_and_what_it_takes():
    msg = str(_config_error("xla", block_q=256))
    assert msg == ("attention backend 'xla' does not take option(s) ['block_q']; it takes none; "
                   "block_q=256 applies to backends splash, flash, sage, sage_xla, ulysses, ring, "
                   "ulysses_ring")
    with pytest.raises(OptionError, match=r"'ulysses' does not take option\(s\) \['fused_bwd'\]; "
                       r"it takes \[.*'out_a2a'\] \(with local='xla'\); fused_bwd=True applies "
                       r"to backend splash"):
        validate(load_config("tiny", ["attention.backend=ulysses", "attention.fused_bwd=true"]))


def test_cross_backend_counts_as_a_kernel_the_config_runs():
    check_attention(AttentionConfig(backend="xla", cross_backend="splash", block_q=256))
    msg = str(_config_error("xla", cross_backend="cudnn", block_q=256))
    assert "it takes none (with cross_backend='cudnn')" in msg


def test_every_option_of_every_options_class_is_a_config_key():
    vocabulary = registry.option_vocabulary()
    for entry in registry.BACKENDS.values():
        for name in entry.options.names():
            assert name in OPTION_DEFAULTS and name in vocabulary, (entry.name, name)
    assert set(OPTION_DEFAULTS) == set(vocabulary)
    assert set(VALUES) == set(vocabulary)


@pytest.mark.parametrize("backend,option", [
    (b, o) for b, e in registry.BACKENDS.items() for o in e.options.names()])
def test_every_option_reaches_its_backend_from_the_config(backend, option):
    """``attention.<option>=value`` (parsed from the override text) ends in the options
    object the backend's call runs with."""
    value = "flat" if (backend, option) == ("ring", "out_a2a") else VALUES[option]
    text = str(value).lower()
    cfg = load_config("tiny", [f"attention.backend={backend}", f"attention.{option}={text}"])
    assert getattr(cfg.attention, option) == value
    check_attention(cfg.attention)
    options = plan_attention(cfg.attention).self_attn.options
    assert getattr(options, option) == value


def test_fused_bwd_reaches_splash(monkeypatch):
    """``attention.fused_bwd=true`` is what the splash kernel function is called with, as the
    backend and as the local kernel of ulysses (via ``local_options``)."""
    from ditax.attention import splash

    seen = []

    def record(q, k, v, **kw):
        seen.append(kw)
        return q

    monkeypatch.setattr(splash, "splash_attention", record)
    cfg = load_config("tiny", ["attention.backend=splash", "attention.fused_bwd=true"])
    plan_attention(cfg.attention).self_attn(Q, Q, Q)
    assert seen[-1]["fused_bwd"] is True and seen[-1]["block_q"] == 128

    acfg = AttentionConfig(backend="ulysses", local="splash", fused_bwd=True)
    check_attention(acfg)
    call = plan_attention(acfg).self_attn
    assert call.options.local_options == (("fused_bwd", True),)
    name, local = call.local()
    assert name == "splash" and local.fused_bwd is True
    mesh = ditax.make_mesh({"fsdp": 1, "context": 2, "data": -1})
    for options in (call.options, {"local": "splash", "fused_bwd": True}):   # config, attend
        sp = plan_sequence_parallel("ulysses", mesh, q_shape=(4, 256, 2, 8), options=options)
        assert sp.local.name == "splash" and sp.local.options.fused_bwd is True
    cross = plan_attention(acfg).cross_attn           # the local kernel, for text K/V
    assert cross.backend == "splash" and cross.options.fused_bwd is True


def test_defaults_and_existing_keys_keep_their_meaning():
    default = AttentionConfig()
    assert (default.backend, default.local, default.out_a2a, default.ulysses_shards,
            default.block_q, default.block_kv) == ("xla", "xla", "flat", 0, None, None)
    plan = plan_attention(AttentionConfig(backend="ulysses_ring", local="flash",
                                          out_a2a="chunked", ulysses_shards=2))
    o = plan.self_attn.options
    assert (o.local, o.out_a2a, o.ulysses_shards, o.block_q, o.block_kv) == (
        "flash", "chunked", 2, 128, 128)
    assert o.local_options == ()
    assert plan.cross_attn.backend == "flash"
    assert dataclasses.replace(default, fused_bwd=False).fused_bwd is False


def test_auto_takes_what_its_kernels_take_and_is_checked_once_decided():
    acfg = AttentionConfig(backend="auto", block_q=256)
    check_attention(acfg)               # splash (TPU) takes it: cannot be refused yet
    with pytest.raises(OptionError, match=r"backend 'xla' does not take option\(s\) \['block_q'\]"):
        plan_attention(acfg)            # on CPU auto is xla
    with ditax.target_platform("tpu"):
        assert plan_attention(acfg).self_attn.options.block_q == 256
    with pytest.raises(OptionError, match=r"'auto' does not take option\(s\) \['ulysses_shards'\]"):
        check_attention(AttentionConfig(backend="auto", ulysses_shards=2))


def test_entry_contexts_are_declared_by_the_registry():
    declared = {n for n, e in registry.BACKENDS.items() if e.entry_context is not None}
    assert declared == {"te"}
    assert sites(AttentionConfig(backend="ring", local="te")) == ("ring", "te")
    assert needs_entry_context(AttentionConfig(backend="ulysses", local="te"))
    assert not needs_entry_context(AttentionConfig(backend="auto"))
    said = []
    with entry_context(AttentionConfig(backend="splash"), None, say=said.append):
        pass
    assert said == []
