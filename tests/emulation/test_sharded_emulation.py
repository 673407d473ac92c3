"""The sharded mode in Mininet: the microburst scenario with a shard server on every worker host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dblp.results.analysis import load

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.mininet
def test_sharded_microburst_run_shares_one_norm_and_shows_the_burst(tmp_path):
    cmd = [sys.executable, str(ROOT / "scenarios" / "microburst.py"), "--workload", "none", "--model", "2e5",
           "--iterations", "16", "--bursts", "10", "--policies", "baseline", "--aggregation", "sharded",
           "--bandwidth", "200", "--queue", "1000000B", "--results", str(tmp_path), "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run,) = list(tmp_path.glob("microburst-*"))
    d = run / "baseline" / "records"
    shards = {j: list(load(d / f"server.shard{j}.jsonl")) for j in range(3)}
    workers = [r for r in load(d) if r.role == "worker"]
    assert {r.extra.get("shards") for r in workers} == {3}
    # worker i's own shard (its server at the worker's own address) moved through shared memory
    assert all(r.extra.get("local_shard") == r.worker for r in workers)
    assert len(workers) == 3 * 16
    # every shard's policy saw the same norm (the whole mean's) in every round
    for k in range(16):
        norms = {r.grad_norm for j in shards for r in shards[j] if r.round == k}
        assert len(norms) == 1, (k, norms)
    # every shard server asks the round clock (dblp.transport.watch.RoundHookServer): the burst marks round 10, only it
    for j in range(3):
        assert {r.round for r in shards[j] if r.extra.get("burst")} == {10}, j
    wrk = {(r.worker, r.round): r for r in workers}
    for w in range(3):
        # 70% loss on every worker's incoming link at p = 0.8% takes ~14 passes; the calm round before it one or two
        assert wrk[(w, 10)].up_passes >= 8, w
        assert wrk[(w, 9)].up_passes < 5, w
        # a host's own shard never crosses a link: its shard server's broadcast to it took one pass, to the
        # other hosts (through the 70% loss on their incoming links) many
        at10 = {r.worker: r for r in shards[w] if r.round == 10}
        assert at10[w].down_passes == 1, (w, at10[w])
        assert all(at10[o].down_passes >= 5 for o in range(3) if o != w), (w, at10)
