"""ffmpeg children run without a preloaded malloc replacement (:func:`ditax.io.ffmpeg.child_env`):
under tcmalloc the shipped ffmpeg encodes the same frames to different H.264 bytes about one
time in twenty-five, which made ``ditax serve``'s video differ from ``ditax generate``'s."""

from __future__ import annotations

import glob
import hashlib
import os

import numpy as np
import pytest

from ditax.io.ffmpeg import child_env
from ditax.io.video import write_mp4


def test_child_env_drops_only_the_allocators():
    env = child_env({"PATH": "/bin", "LD_PRELOAD": "/usr/lib/x/libtcmalloc_minimal.so.4 "
                     "/opt/libfoo.so:/usr/lib/libjemalloc.so.2:/lib/libmimalloc.so"})
    assert env == {"PATH": "/bin", "LD_PRELOAD": "/opt/libfoo.so"}
    assert "LD_PRELOAD" not in child_env({"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"})
    assert child_env({"A": "1"}) == {"A": "1"}


@pytest.mark.skipif(not glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4"),
                    reason="no tcmalloc on this machine")
def test_the_same_frames_give_the_same_mp4_under_tcmalloc(tmp_path, monkeypatch):
    """40 encodes of the demo model's 32x32x5 clip of the serve test (stored losslessly:
    data/demo_clip_5x32x32.png, the frames top to bottom) with tcmalloc preloaded: one file.
    Without :func:`child_env` about four in ten of its encodes differed (most clips never
    do)."""
    import PIL.Image

    monkeypatch.setenv("LD_PRELOAD", glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4")[0])
    strip = np.asarray(PIL.Image.open(os.path.join(os.path.dirname(__file__), "data",
                                                   "demo_clip_5x32x32.png")).convert("RGB"))
    frames = strip.reshape(5, 32, 32, 3)
    digests = set()
    for i in range(40):
        path = write_mp4(tmp_path / f"v{i}.mp4", frames, fps=16)
        digests.add(hashlib.md5(path.read_bytes()).hexdigest())
        os.unlink(path)
    assert len(digests) == 1, len(digests)
