"""The benchmarks' common start (dblp.runs.startline): every worker holds its gradient before a round's clock starts."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from dblp.protocol.records import read_records
from dblp.runs.startline import StartLine, StartLineTimeout
from dblp.protocol.wire import ParameterError
from procs import PY, ROOT, env, free_port, start_server


def test_workers_leave_the_line_together_once_the_last_arrives(tmp_path):
    """Three workers ready 0, 0.2 and 0.4 s apart leave within a few ms of each other, and the
    first waited for the last."""
    left, waited = {}, {}

    def worker(me: int) -> None:
        line = StartLine(tmp_path, 3, me)
        time.sleep(0.2 * me)  # making its gradient
        waited[me] = line.wait(0)
        left[me] = time.monotonic()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert max(left.values()) - min(left.values()) < 0.05
    assert waited[0] >= 0.35 and waited[1] >= 0.15 and waited[2] < 0.05


def test_a_round_two_back_leaves_no_mark(tmp_path):
    """Marks of round r-2 go at round r (everyone left that line): a run leaves two rounds' marks."""
    lines = [StartLine(tmp_path, 2, w) for w in range(2)]
    for r in range(5):
        for line in lines:
            line._mark(r, line.me).touch()  # the other worker is ready too
        for line in lines:
            line.wait(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "round3.worker0", "round3.worker1", "round4.worker0", "round4.worker1"]


def test_a_worker_that_never_comes_is_named_in_bounded_time(tmp_path):
    line = StartLine(tmp_path, 3, 0, timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(StartLineTimeout, match=r"round 0: worker\(s\) 1, 2 not ready after 0.2 s"):
        line.wait(0)
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("parties, me", [(0, 0), (3, 3), (3, -1)])
def test_a_worker_outside_the_run_is_refused(tmp_path, parties, me):
    with pytest.raises(ParameterError, match=f"worker {me} of {parties} workers"):
        StartLine(tmp_path, parties, me)


def test_dblp_workers_start_their_rounds_together(tmp_path):
    """Two real ``dblp worker`` processes, one with 0.4 s more compute before every round: with
    ``--start-together`` their rounds start within milliseconds (each record's t_start), without it
    0.4 s apart."""
    spreads = {}
    for together in (True, False):
        port = free_port()
        d = tmp_path / ("with" if together else "without")
        d.mkdir()
        srv = start_server(port, "--workers", "2", "--model", "20000", "--iterations", "3", "--peer-timeout", "30s")
        extra = ["--start-together", str(d / "line")] if together else []
        workers = [subprocess.Popen([PY, "-m", "dblp", "worker", "--server", f"127.0.0.1:{port}", "--id", str(w),
                                     "--model", "20000", "--iterations", "3", "--compute", f"{0.4 * w}s",
                                     "--records", str(d / f"w{w}.jsonl"), "--peer-timeout", "30s", *extra],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
                   for w in range(2)]
        for p in workers + [srv]:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
        starts = [[r.t_start for r in read_records(d / f"w{w}.jsonl")] for w in range(2)]
        spreads[together] = [abs(a - b) for a, b in zip(*starts)]
    assert len(spreads[True]) == 3 and max(spreads[True]) < 0.1
    assert min(spreads[False][1:]) > 0.3  # round 0: the first also waited for the server's ROUND
