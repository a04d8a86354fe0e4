"""``ditax.finite.host_all_finite`` (16-bit floats checked by their exponent bits) against
numpy's ``isfinite`` on fresh random arrays with inf / nan at random places."""

import ml_dtypes
import numpy as np
import pytest

from ditax.finite import all_finite, host_all_finite


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
def test_host_all_finite_equals_isfinite(dtype):
    rng = np.random.default_rng()
    for trial in range(40):
        x = (rng.standard_normal((7, 301)) * 10.0 ** rng.integers(-3, 4)).astype(dtype)
        bad = rng.integers(0, 3)           # 0: all finite, 1: one inf, 2: one nan
        if bad:
            x.flat[rng.integers(x.size)] = [np.inf, -np.inf, np.nan][rng.integers(3)]
        if trial % 3 == 0:
            x = x[:, ::2]                  # not contiguous
        want = bool(np.isfinite(x.astype(np.float32)).all())
        assert host_all_finite(x, chunk=int(rng.integers(1, 700))) == want
        assert host_all_finite(x) == want


def test_extremes_are_finite():
    for dtype in (ml_dtypes.bfloat16, np.float16):
        info = ml_dtypes.finfo(dtype)
        x = np.array([info.max, -info.max, info.tiny, 0.0, -0.0], dtype)
        assert host_all_finite(x) and all_finite(x)
        assert not host_all_finite(np.array([info.max, np.inf], dtype))
