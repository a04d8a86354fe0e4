"""Nothing lost, nothing silent in training runs (issue 23, classes 1-3 and train's output_dir).

One scenario with real ``ditax train`` processes on one output folder: kill -9 mid-run, a rerun
with a changed model (refused, folder untouched), Ctrl-C, SIGTERM, then a clean finish; the
tests below check what each stage left. The checkpointer's own rules (damaged vs foreign
checkpoints, moved-aside folders) and the metrics writer are tested on small states directly.
"""

import hashlib
import json
import os
import pathlib
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from ditax.cli import main as cli_main
from ditax.config import CheckpointConfig
from ditax.train.checkpoint import CheckpointError, Checkpointer
from ditax.train.metrics import MetricsWriter
from ditax.train.resume import ResumeMismatch, check_output_dir
from ditax.errors import ConfigError
from xla_test_flags import xla_flags

LONG = 100_000          # "run for a long time": every stage below is stopped by hand


def _env(cache):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1",
               XLA_FLAGS=xla_flags(1), PYTHONUNBUFFERED="1")
    env.pop("DITAX_CACHE_DIR", None)
    return env


def _args(out, cache, steps=LONG, *extra):
    return ["train", "tiny", f"output_dir={out}", f"steps={steps}", "checkpoint.every=5",
            "checkpoint.keep=50", f"compile_cache={cache}", "--no-progress", *extra]


def _rows(out) -> list[dict]:
    f = pathlib.Path(out) / "metrics.jsonl"
    if not f.exists():
        return []
    rows = []
    for line in f.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def _start(out, cache, log, steps=LONG):
    cmd = [sys.executable, "-m", "ditax.cli", *_args(out, cache, steps)]
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=_env(cache))


def _wait_for(pred, p, what, timeout=300.0):
    t0 = time.monotonic()
    while not pred():
        if p.poll() is not None:
            raise AssertionError(f"the run ended (rc {p.returncode}) before {what}")
        if time.monotonic() - t0 > timeout:
            p.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _snapshot(folder) -> dict:
    """Every file under ``folder``: relative path → (size, sha256, mtime)."""
    out = {}
    for f in sorted(pathlib.Path(folder).rglob("*")):
        if f.is_file():
            out[str(f.relative_to(folder))] = (f.stat().st_size,
                                               hashlib.sha256(f.read_bytes()).hexdigest(),
                                               f.stat().st_mtime_ns)
        else:
            out[str(f.relative_to(folder))] = "dir"
    return out


def _stop_with(sig, out, cache, log, after=4):
    """A run resumed in ``out``, sent ``sig`` once ``after`` new steps are logged."""
    before = _rows(out)
    p = _start(out, cache, log)
    _wait_for(lambda: "resuming from checkpoint step" in pathlib.Path(log).read_text(), p,
              "the resume line")
    start = int(pathlib.Path(log).read_text().split("resuming from checkpoint step ")[1]
                .split()[0])
    # past the rows an earlier run left (they are dropped only once the loop starts): a step
    # no earlier run wrote is this run's, so its loop and signal handlers are up
    target = max(start + after, before[-1]["step"] + 1 if before else 0)
    _wait_for(lambda: _rows(out) and _rows(out)[-1]["step"] >= target, p, f"step {target}")
    p.send_signal(sig)
    rc = p.wait(timeout=300)
    return {"rc": rc, "log": pathlib.Path(log).read_text(), "start": start,
            "last_row": _rows(out)[-1]["step"]}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    root = tmp_path_factory.mktemp("hard")
    out, cache = root / "run", root / "cache"
    seen = {}
    # 1. kill -9 a few steps after a checkpoint: rows past it are on disk
    p = _start(out, cache, root / "a.log")
    _wait_for(lambda: len(_rows(out)) >= 13 and (out / "checkpoints" / "10").is_dir(), p,
              "step 13")
    p.kill()
    p.wait()
    seen["killed_rows"] = len(_rows(out))
    # 2. the same run asked with another model: refused, nothing changed
    before = _snapshot(out)
    seen["mismatch_rc"] = cli_main(_args(out, cache, LONG, "model.num_layers=3"))
    seen["after_mismatch"] = (before, _snapshot(out))
    # 3. Ctrl-C, 4. SIGTERM, each after a resume
    seen["sigint"] = _stop_with(signal.SIGINT, out, cache, root / "b.log")
    seen["sigterm"] = _stop_with(signal.SIGTERM, out, cache, root / "c.log")
    # 5. finish: a few more steps
    last = seen["sigterm"]["last_row"]
    p = _start(out, cache, root / "d.log", steps=last + 3)
    seen["final_rc"] = p.wait(timeout=300)
    seen["final_log"] = (root / "d.log").read_text()
    seen["final_steps"] = last + 3
    seen["out"] = out
    return seen


def test_kill9_then_rerun_keeps_each_step_once(scenario):
    assert scenario["killed_rows"] > 10          # rows after checkpoint 10 were written
    assert scenario["final_rc"] == 0, scenario["final_log"]
    steps = [r["step"] for r in _rows(scenario["out"])]
    assert steps == list(range(1, scenario["final_steps"] + 1))
    assert "metrics: dropped" in scenario["sigint"]["log"]


def _tb_steps(tb: pathlib.Path, tag="train/loss") -> list[int]:
    """Steps of ``tag`` in the TFRecord event files of ``tb`` (tensorboardX's protos)."""
    from tensorboardX.proto import event_pb2

    steps = []
    for f in sorted(tb.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        i = 0
        while i + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            steps += [ev.step for v in ev.summary.value if v.tag == tag]
    return steps


def test_tensorboard_holds_each_step_once(scenario):
    steps = sorted(_tb_steps(scenario["out"] / "tb"))
    assert steps == list(range(1, scenario["final_steps"] + 1))


def test_changed_model_is_refused_and_touches_nothing(scenario, capsys):
    assert scenario["mismatch_rc"] == 2
    before, after = scenario["after_mismatch"]
    assert before == after                      # every checkpoint folder and file as it was
    assert not [k for k in after if ".corrupt" in k]
    # ... and the correct command resumed from the newest checkpoint afterwards
    assert "resuming from checkpoint step 10" in scenario["sigint"]["log"]


def test_changed_model_message_names_keys_and_fix(tmp_path, capsys):
    out = tmp_path / "r"
    (out / "checkpoints" / "2").mkdir(parents=True)       # a run folder with a checkpoint
    (out / "config.yaml").write_text("model: {num_layers: 2, dtype: float32}\nseed: 0\n")
    rc = cli_main(["train", "tiny", f"output_dir={out}", "model.num_layers=3", "seed=5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "model.num_layers: 2 → 3" in err[0] and "seed: 0 → 5" in err[0]
    assert "model.num_layers=2 seed=0" in err[0] and "new output_dir" in err[0]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2"]


@pytest.mark.parametrize("sig,rc,name", [("sigint", 130, "SIGINT"), ("sigterm", 143, "SIGTERM")])
def test_signal_saves_and_says_where_to_resume(scenario, sig, rc, name):
    r = scenario[sig]
    assert r["rc"] == rc, r["log"][-2000:]
    saved = int(r["log"].split(f"stopped by {name}: saved checkpoint step ")[1].split()[0])
    assert saved == r["last_row"] and saved > r["start"]
    assert f"resumes from step {saved}" in r["log"]
    assert (scenario["out"] / "checkpoints" / str(saved)).is_dir()


# ----------------------------------------------------------------------------------------------
# the checkpointer's rules, on small states


def _ckpt(path):
    return Checkpointer(path, CheckpointConfig(every=1, keep=10, async_save=False),
                        say=lambda m: None)


def _state(step, n=3):
    return {"w": np.full((n,), float(step), np.float32)}


def _abstract(n=3):
    import jax

    return {"w": jax.ShapeDtypeStruct((n,), np.float32)}


def _write(path, steps=(2, 4)):
    c = _ckpt(path)
    for s in steps:
        c.save(s, _state(s), {"step": s})
    c.close()


def _damage(path, step):
    for f in (path / str(step) / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")


def test_all_unreadable_checkpoints_are_left_in_place(tmp_path):
    _write(tmp_path)
    _damage(tmp_path, 2), _damage(tmp_path, 4)
    with pytest.raises(CheckpointError, match=r"tried steps \[4, 2\].*nothing was moved"):
        _ckpt(tmp_path).restore_latest(_abstract())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name[0].isdigit()) == ["2", "4"]


def test_a_checkpoint_of_another_shape_is_refused_not_moved(tmp_path):
    _write(tmp_path)
    with pytest.raises(ResumeMismatch, match=r"step 4 .*w: \(3,\) float32 → \(5,\) float32"):
        _ckpt(tmp_path).restore_latest(_abstract(5))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name[0].isdigit()) == ["2", "4"]


def test_only_moved_aside_checkpoints_refuse_a_fresh_start(tmp_path):
    _write(tmp_path)
    _damage(tmp_path, 4)
    step, state, _ = _ckpt(tmp_path).restore_latest(_abstract())   # 4 moved aside, 2 restored
    assert step == 2 and (tmp_path / "4.corrupt").is_dir()
    shutil.move(tmp_path / "2", tmp_path / "2.corrupt")
    with pytest.raises(CheckpointError, match=r"4\.corrupt.*not starting over from step 0"):
        _ckpt(tmp_path).restore_latest(_abstract())


# ----------------------------------------------------------------------------------------------
# metrics writer and output_dir


def test_metrics_writer_drops_rows_after_the_resume_step_and_a_cut_line(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 8))
                 + '{"step": 8, "lo')
    w = MetricsWriter(tmp_path, resume_step=5)
    w.write({"step": 6, "loss": 0.5})
    w.close()
    assert [json.loads(x)["step"] for x in f.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    assert w.dropped == 3
    assert sorted(_tb_steps(tmp_path / "tb")) == [1, 2, 3, 4, 5, 6]


def test_output_dir_is_checked_before_anything_loads(tmp_path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ConfigError, match=r"is a file"):
        check_output_dir(f)
    with pytest.raises(ConfigError, match=r"output_dir=.*run: .*file\.txt is a file, not a "
                                          r"folder"):
        check_output_dir(f / "run")
    with pytest.raises(ConfigError, match=r"output_dir=/proc/run: the folder /proc is not "
                                          r"writable"):   # even for root
        check_output_dir("/proc/run")
    other = tmp_path / "photos"
    other.mkdir()
    (other / "a.jpg").write_text("x")
    rc = cli_main(["train", "tiny", f"output_dir={other}"])
    err = capsys.readouterr().err
    assert rc == 2 and "non-empty folder that holds no run (a.jpg)" in err
    assert sorted(p.name for p in other.iterdir()) == ["a.jpg"]


def test_vae_runs_follow_their_own_resume_policy(tmp_path):
    """train-vae: steps / eval cadence change freely, the optimiser with a printed line, the
    architecture and the clips are refused naming the key."""
    from ditax.train.wan.vae_config import load_vae_config, vae_config_dict
    from ditax.train.resume import check_resume
    from ditax.train.wan.vae import VAE_RESUME_POLICY

    def cfg(**kw):
        return vae_config_dict(load_vae_config(None, **{"data.source": str(tmp_path), **kw}))

    old, said = cfg(steps=10), []
    assert check_resume(tmp_path, old, cfg(steps=20, eval_every=5), VAE_RESUME_POLICY,
                        say=said.append) == ["steps", "eval_every"] and not said
    check_resume(tmp_path, old, cfg(steps=10, **{"optim.learning_rate": 3e-4}),
                 VAE_RESUME_POLICY, say=said.append)
    assert len(said) == 1 and "optim.learning_rate" in said[0]
    for key, value in (("vae.base_dim", 32), ("data.crop", 16), ("batch_size", 2),
                       ("seed", 1)):
        with pytest.raises(ResumeMismatch, match=rf"{key}: .* → {value}"):
            check_resume(tmp_path, old, cfg(steps=10, **{key: value}), VAE_RESUME_POLICY)
