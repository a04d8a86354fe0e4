"""The causal KV cache's key count (:func:`ditax.models.wan.kv_cache.cache_tokens`) follows the
self-attention kernel's own key block on its platform (the blocks table), not a fixed row:
padded only by the work region (fewer keys than a chunk), to a whole number of the kernel's
blocks for the padded count, so the kernel pads nothing; unpadded where the kernel takes no
table block (CPU interpret, the xla backend) or the keys are split over context shards."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from ditax.attention.plan import resolve
from ditax.models.wan.kv_cache import cache_tokens
from ditax.parallel.platform import Platform


def _model(backend: str, platform: Platform, seq_shards: int = 1, **options):
    call = resolve(backend, options, platform=platform)
    return NS(attention_plan=NS(self_attn=call), sharding=NS(seq_shards=seq_shards)), call


@pytest.mark.parametrize("kind", ["TPU v5 lite", "TPU v6 lite", "TPU v4"])
@pytest.mark.parametrize("backend", ["splash", "flash"])
@pytest.mark.parametrize("tokens,slots", [(4680, 4), (1560, 2), (1560, 7), (100, 3), (8190, 1)])
def test_tpu_cache_is_whole_kernel_blocks_within_one_chunk(kind, backend, tokens, slots):
    model, call = _model(backend, Platform("tpu", device_kind=kind))
    n = (slots + 1) * tokens
    keys = cache_tokens(model, tokens, slots)
    assert n <= keys < n + tokens
    if keys > n:
        assert keys % call.key_block(tokens, keys) == 0
    # the slots the cache's length gives back are the ones asked for
    assert keys // tokens - 1 == slots


def test_wan_480p_on_a_v5e_pads_to_the_kernels_blocks():
    """Wan 1.3B 480p, sink + 3 chunks of 4,680 tokens + the chunk: 23,400 keys, which splash
    on a v5e takes in key blocks of 2,048 or 4,096 (the table's row with or without the raised
    scoped VMEM): 24,576."""
    model, call = _model("splash", Platform("tpu", device_kind="TPU v5 lite"))
    assert call.key_block(4680, 23400) in (2048, 4096)
    assert cache_tokens(model, 4680, 4) == 24576
    # a block given as an option is the kernel's block, so the cache's
    model, call = _model("splash", Platform("tpu", device_kind="TPU v5 lite"), block_kv=1024,
                         block_kv_compute=512)
    assert call.key_block(4680, 23400) == 1024 and cache_tokens(model, 4680, 4) == 23552


@pytest.mark.parametrize("backend,platform,shards", [
    ("splash", Platform("cpu"), 1),                                 # interpret: no table
    ("xla", Platform("tpu", device_kind="TPU v5 lite"), 1),         # no key blocks
    ("splash", Platform("tpu", device_kind="TPU v5 lite"), 4),      # keys over context shards
])
def test_unpadded_where_the_kernel_takes_no_table_block(backend, platform, shards):
    model, _ = _model(backend, platform, seq_shards=shards)
    assert cache_tokens(model, 4680, 4) == 23400
