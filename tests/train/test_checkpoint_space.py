"""A checkpoint that does not fit (issue 41, class 7): one line naming the folder and the space
it needs, exit 1, the previous checkpoint intact, and a rerun resumes from it.

``ditax train`` runs in processes of their own: a first run writes checkpoint step 1; a rerun
under a file-size limit (``RLIMIT_FSIZE``, what ``ulimit -f`` sets: a write past it fails as
on a full disk, EFBIG) fails to write step 2; a rerun without the limit resumes from step 1.
A real full disk (ENOSPC) is a small tmpfs where this host lets the tests mount one (root with
the capability; skipped elsewhere), with the checkpointer on its own.
"""

import os
import resource
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from ditax.config import CheckpointConfig
from ditax.train.checkpoint import Checkpointer, CheckpointSaveError
from xla_test_flags import xla_flags

LIMIT = 100 * 1024          # bytes a file may grow to: the checkpoint's data files are bigger


def _train(out, cache, steps, limit=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1",
               XLA_FLAGS=xla_flags(1), PYTHONUNBUFFERED="1")
    env.pop("DITAX_CACHE_DIR", None)

    def limited():              # in the child: writes past LIMIT fail (EFBIG), not kill it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    args = ["train", "tiny", f"output_dir={out}", f"steps={steps}", "checkpoint.every=1",
            "checkpoint.keep=1", "batch_size=1", "data.num_frames=1", "data.height=32",
            "data.width=32", f"compile_cache={cache}", "--no-progress"]
    return subprocess.run([sys.executable, "-m", "ditax.cli", *args], capture_output=True,
                          text=True, env=env, timeout=600,
                          preexec_fn=limited if limit else None)


def test_a_checkpoint_past_a_file_size_limit_is_one_line_and_the_last_one_resumes(tmp_path):
    out, cache = tmp_path / "run", tmp_path / "cache"
    first = _train(out, cache, 1)
    assert first.returncode == 0, first.stderr[-2000:]
    before = {p.relative_to(out): p.read_bytes() for p in (out / "checkpoints").rglob("*")
              if p.is_file()}

    full = _train(out, cache, 2, limit=LIMIT)
    lines = (full.stdout + full.stderr).strip().splitlines()
    assert full.returncode == 1, lines[-20:]
    assert len(lines) <= 3, f"{len(lines)} lines: {lines[:6]}"
    err = lines[-1]
    assert err.startswith("ditax train: error: checkpoint step 2 could not be written to "
                          f"{out / 'checkpoints'}: a file outgrew"), err
    assert "ulimit -f = 100.0 KiB" in err and "a checkpoint needs about" in err, err
    assert "delete its partial folder 2.orbax-checkpoint-tmp" in err, err
    assert "resumes from checkpoint step 1, which is intact" in err, err
    # step 1 as it was, beside the partial step 2
    after = {p.relative_to(out): p.read_bytes() for p in (out / "checkpoints" / "1").rglob("*")
             if p.is_file()}
    assert after == before
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "1", "2.orbax-checkpoint-tmp"]

    again = _train(out, cache, 2)       # the partial folder left in place: it is replaced
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from checkpoint step 1" in again.stdout
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2"]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (a real full disk), where this host allows mounting one."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs",
                                            str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root with CAP_SYS_ADMIN")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def _state(n, seed=0):
    """``n`` arrays of 400 kB of random float32 (they do not compress)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), n)
    return {f"w{i}": jax.random.normal(k, (100, 1000)) for i, k in enumerate(keys)}


def test_a_full_disk_is_one_error_the_previous_checkpoint_restores(small_disk, capfd):
    """Step 2 (4.8 MB) does not fit beside step 1 (1.2 MB) on 2 MiB: the failure surfaces at
    the next save (step 3; saves are async) naming step 2 and its partial folder, with nothing
    else printed; step 1 restores."""
    ck = Checkpointer(small_disk / "ck", CheckpointConfig(keep=1, every=1))
    ck.save(1, _state(3), {"at": 1})
    ck.wait()
    capfd.readouterr()
    ck.save(2, _state(12, 1), {"at": 2})
    with pytest.raises(CheckpointSaveError) as e:     # it waits for step 2 first
        ck.save(3, _state(3, 2), {"at": 3})
    ck.close()
    msg = str(e.value)
    assert msg.startswith(f"checkpoint step 2 could not be written to {small_disk / 'ck'}: "
                          f"the disk is full; a checkpoint needs about "), msg
    assert "is free there" in msg and "resumes from checkpoint step 1, which is intact" in msg
    assert "delete its partial folder 2.orbax-checkpoint-tmp" in msg, msg
    assert len(msg.splitlines()) == 1
    printed = capfd.readouterr()
    assert printed.out == printed.err == "", (printed.out[:500], printed.err[:2000])

    ck = Checkpointer(small_disk / "ck", CheckpointConfig(keep=1, every=1))
    want = _state(3)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          want)
    step, state, data = ck.restore_latest(target)
    ck.close()
    assert (step, data) == (1, {"at": 1})
    for k in want:
        np.testing.assert_array_equal(np.asarray(state[k]), np.asarray(want[k]))
