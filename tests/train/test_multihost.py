"""Multi-host: `ditax train` as 2 processes × 4 CPU devices (gloo, 127.0.0.1) gives the losses
of 1 process × 8 devices on the same data."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from ditax.train.loop import train
from latent_datasets import run_cfg, write_dataset
from xla_test_flags import xla_flags

pytestmark = pytest.mark.usefixtures("fast_compile")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# one layer: the property is the 2-process run's losses equal the 1-process run's, any depth
SMALL = ["model.num_layers=1"]


def test_two_processes_match_one(tmp_path):
    ds = write_dataset(tmp_path / "ds", n=16, seed=7)
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=xla_flags(4) + " --xla_backend_optimization_level=0")
    out = tmp_path / "mh"
    procs = []
    for pid in range(2):
        cmd = [sys.executable, "-m", "ditax.cli", "train", "--no-progress", "tiny", *SMALL,
               f"data.source={ds}", f"output_dir={out}", "checkpoint.every=2", "steps=3",
               f"mesh.coordinator_address=127.0.0.1:{port}", "mesh.num_processes=2",
               f"mesh.process_id={pid}"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    # the single-process reference runs here (8 devices from conftest) while they compile
    ref = train(run_cfg(tmp_path / "one", ds, "steps=3", *SMALL), progress=False)
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0])
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in rows], ref.losses, rtol=1e-5)
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "3"]
