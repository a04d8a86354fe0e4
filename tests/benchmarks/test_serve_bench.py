"""``benchmarks/serve.py``'s rows say why jobs were lost: ``load()`` against a fake server
(no process: its jobs fail, or its calls raise) counts the final statuses, keeps the first
distinct errors and the exit status of a server that died, and prints the server's log tail
to stderr; a row of completed jobs carries none of these."""

from __future__ import annotations

import importlib.util
import itertools
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("serve_bench", ROOT / "benchmarks" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeServer:
    """``submit`` / ``wait`` as :class:`serve_fixtures.Server`'s: the n-th job ends as
    ``outcomes[n % len]`` (a job's status and error, or an exception the call raises)."""

    def __init__(self, folder: pathlib.Path, outcomes, log="", proc=None):
        self.log = folder / "server.log"
        self.log.write_text(log)
        self.outcomes, self.proc, self.n = outcomes, proc, itertools.count()

    def submit(self, **body):
        return {"id": f"video_{next(self.n)}"}

    def wait(self, job_id, timeout=0.0, poll=0.0):
        outcome = self.outcomes[int(job_id.split("_")[1]) % len(self.outcomes)]
        if isinstance(outcome, Exception):
            raise outcome
        status, error = outcome
        return {"id": job_id, "status": status, "error": error and {"message": error},
                "seconds_to_finish": 1.0, "seconds_queued": 0.1, "batch_size": 2}


def test_lost_jobs_carry_their_statuses_errors_and_the_log_tail(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    srv = FakeServer(tmp_path, [("failed", "RuntimeError: RESOURCE_EXHAUSTED at batch 16"),
                                ("completed", None), ("cancelled", None),
                                ("failed", "RuntimeError: RESOURCE_EXHAUSTED at batch 16"),
                                ("failed", "decode: NaN"), ("failed", "a fourth error"),
                                ("failed", "a fifth error"),
                                ConnectionRefusedError("no server")],
                     log="warm: compiled 5 programs\njobs video_0 failed: the reason\n",
                     proc=dead)
    row = _bench().load([srv], {}, clients=1, jobs=8, think=0.0, seed0=0)   # jobs in order
    assert row["accepted"] == 8 and row["lost"] == 7, row
    assert row["statuses"] == {"failed": 5, "completed": 1, "cancelled": 1, "unanswered": 1}
    # the first three distinct ones, in order
    assert row["errors"] == ["RuntimeError: RESOURCE_EXHAUSTED at batch 16", "decode: NaN",
                             "a fourth error"]
    assert row["server_exit"] == [3]
    err = capsys.readouterr().err
    assert "7 job(s) not completed" in err and "jobs video_0 failed: the reason" in err


def test_a_row_of_completed_jobs_says_nothing_more(tmp_path, capsys):
    srv = FakeServer(tmp_path, [("completed", None)], log="all well\n")
    row = _bench().load([srv], {}, clients=2, jobs=2, think=0.0, seed0=0)
    assert row["accepted"] == 4 and row["lost"] == 0 and row["mean_rows"] == 2
    assert not {"statuses", "errors", "server_exit"} & set(row)
    assert "all well" not in capsys.readouterr().err
