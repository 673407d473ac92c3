"""The microburst scenario on namespace hosts with Mininet hidden (a GPU machine has none): real
training workers, one burst, Tables II/IV/V, and nothing of the run left in the kernel."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.results.analysis import load
from dblp.cli.provenance import run_values

ROOT = Path(__file__).resolve().parents[2]
needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or any(shutil.which(t) is None for t in ("ip", "tc", "nft")),
    reason="namespace hosts need root, iproute2 (ip, tc) and nft")

#: makes `import mininet` fail in the scenario's interpreter, as on a machine without it
HIDE_MININET = '''
import sys
class _NoMininet:
    def find_spec(self, name, path=None, target=None):
        if name == "mininet" or name.startswith("mininet."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None
sys.meta_path.insert(0, _NoMininet())
'''


def path_without(tool: str, into: Path) -> str:
    """A PATH of one folder holding links to every program on ours except ``tool``."""
    into.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            src, dst = os.path.join(d, name), into / name
            if name != tool and not dst.exists() and os.access(src, os.X_OK) and not os.path.isdir(src):
                dst.symlink_to(src)
    return str(into)


@pytest.mark.netns
@pytest.mark.slow
@needs_netns
def test_microburst_trains_on_namespace_hosts_without_mininet(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(HIDE_MININET)
    path = path_without("mnexec", tmp_path / "bin")
    assert shutil.which("mnexec", path=path) is None
    env = {**os.environ, "PATH": path, "PYTHONPATH": f"{shim}{os.pathsep}{ROOT}"}
    # the shim works: this interpreter, with that environment, cannot import Mininet
    probe = subprocess.run([sys.executable, "-c", "import mininet"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "hidden by the test" in probe.stderr
    cmd = [sys.executable, str(ROOT / "scenarios" / "microburst.py"), "--workload", "digits_mlp", "--iterations", "14",
           "--bursts", "12", "--policies", "baseline,dblp", "--device", "cpu", "--results", str(tmp_path), "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-4000:]
    assert "hosts: netns (--hosts auto: the mininet Python package does not import" in out, out[:2000]
    assert "workers compute on: cpu" in out
    for table in ("Table II", "Table IV", "Table V"):
        assert table in out, table
    (run,) = list(tmp_path.glob("microburst-*"))
    conf = json.loads((run / "config.json").read_text())  # the flags as given; what the run derived apart
    used = run_values(conf)
    assert (conf["hosts"], used["hosts_kind"], used["train"]["device"]) == ("auto", "netns", "cpu")
    assert "hosts_kind" not in conf and conf["derived"]["hosts_kind"] == "netns"
    # Table II: the burst at 12 (after the first CLR check at 10: DBLP at P_high) slows the baseline (p = 0.8%: ~14 passes at 70% loss) more than DBLP (3)
    s = json.loads((run / "summary_runs.json").read_text())
    assert s["baseline"]["passes_at_bursts"][0] >= 10 and s["dblp"]["passes_at_bursts"][0] <= 4, s
    assert s["baseline"]["at_bursts"][0] > s["dblp"]["at_bursts"][0]
    rows = list(csv.reader(open(run / "table_ii.csv")))
    assert rows[0][0] == "Latency (s)" and [r[0] for r in rows[1:]] == ["DBLP", "Baseline", "Speedup (x)"]
    assert float(rows[3][1]) > 1.0  # DBLP's speedup at the burst
    for policy in ("baseline", "dblp"):  # the burst hit the round it names (the server's round hook)
        recs = load(run / policy / "records")
        srv = {(r.worker, r.round): r for r in recs if r.role == "server"}
        assert {k for (w, k), r in srv.items() if r.extra.get("burst")} == {12}, policy
        assert max(k for _, k in srv) == 13  # the training drove every round
    # Table IV: every worker learnt (digits_mlp on the digits, one epoch: chance is 0.1)
    t4 = list(csv.reader(open(run / "table_iv.csv")))
    assert [r[0] for r in t4[1:]] == ["baseline", "dblp"]
    assert all(0.3 < float(x) <= 1.0 for r in t4[1:] for x in r[1:]), t4
    # Table V: both conditions, times positive, each normalised to DBLP under the same condition
    t5 = list(csv.reader(open(run / "table_v.csv")))
    assert [(r[0], r[1]) for r in t5[1:]] == [("with bursts at 12", "baseline"), ("with bursts at 12", "dblp"),
                                             ("no bursts", "baseline"), ("no bursts", "dblp")]
    assert all(float(r[2]) > 0 for r in t5[1:]) and float(t5[2][4]) == 1.0 and float(t5[4][4]) == 1.0
    # nothing left: no namespace of the run (its veths, bridge, qdiscs and nft tables lived in them)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"dblpns-{proc.pid}-" not in left, left
