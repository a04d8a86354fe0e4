"""The frame-by-frame pixel conversions (:mod:`ditax.io.frames`) equal the whole-array
expressions they replace, bit for bit, threaded or not, and leave their input alone."""

import ml_dtypes
import numpy as np
import pytest

from ditax.io.frames import uint8_frames, unit_pixels
from ditax.pipelines.base import channels_last, to_unit


@pytest.mark.parametrize("shape,dtype", [
    ((1, 3, 9, 400, 400), np.float32),           # above the threads' threshold
    ((2, 3, 5, 24, 40), ml_dtypes.bfloat16),      # a batch: its first row
    ((1, 3, 64, 48), np.float32),                 # an image [B, C, H, W]
])
def test_unit_pixels_equals_to_unit_then_channels_last(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 1.3).astype(dtype)
    x.flat[:4] = np.array([-1, 1, 3, -3], dtype)         # the clip's both sides
    before = x.copy()
    got = unit_pixels(x)
    want = channels_last(to_unit(x))
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("shape,dtype", [((9, 400, 400, 3), np.float32),
                                         ((3, 20, 30, 3), np.float64)])
def test_uint8_frames_equals_the_whole_array_expression(shape, dtype):
    rng = np.random.default_rng(7)
    v = (rng.random(shape) * 1.2 - 0.1).astype(dtype)
    v.flat[:3] = [0.5 / 255, 1.5 / 255, 254.5 / 255]      # halves: round to even
    before = v.copy()
    want = np.round(np.clip(v.astype(np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)
    np.testing.assert_array_equal(uint8_frames(v), want)
    np.testing.assert_array_equal(v, before)
