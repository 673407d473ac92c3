"""Every command refuses a user's mistake up front: exit status 2, a message that
names the flag and the value, and never a traceback.

Each case runs the command as a subprocess (as a user would) with one bad
value. The refusal must come while the arguments are parsed, before any
network, Mininet, process or kernel change: so even the Mininet scenarios
answer in seconds, and (as root) leave no namespace or nftables table behind.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TIMEOUT_S = 60  # per command; a refusal takes a second or two (train.py: the torch import)


def _busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


_BUSY = _busy_port()  # held for the module's life: "a busy port"
BUSY = str(_BUSY.getsockname()[1])
_UDP_BUSY = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_UDP_BUSY.bind(("0.0.0.0", 0))
UDP_BUSY = str(_UDP_BUSY.getsockname()[1])


def _mod(m: str, *a: str) -> list[str]:
    return [PY, "-m", m, *a]


def _scn(name: str, *a: str) -> list[str]:
    return [PY, str(ROOT / "scenarios" / name), *a]


SRV = ("dblp", "server")
WRK = ("dblp", "worker", "--server", "127.0.0.1:1")
LB = ("dblp", "loopback")
SIM = ("dblp.sim", "run", "--iterations", "3")
TRN = ("dblp.train", "worker", "--server", "127.0.0.1:1", "--out", "/nonexistent-out")

#: (command, words stderr must contain: the flag and the bad value)
CASES: list[tuple[list[str], tuple[str, ...]]] = [
    # python -m dblp server
    (_mod(*SRV, "--p-low", "2"), ("--p-low", "2")),
    (_mod(*SRV, "--p", "-0.1"), ("--p", "-0.1")),
    (_mod(*SRV, "--p-low", "0.5", "--p-high", "0.1"), ("--p-high", "0.1", "--p-low", "0.5")),
    (_mod(*SRV, "--eta", "-1"), ("--eta", "-1")),
    (_mod(*SRV, "--freq", "0"), ("--freq", "0")),
    (_mod(*SRV, "--workers", "0"), ("--workers", "0")),
    (_mod(*SRV, "--iterations", "0"), ("--iterations", "0")),
    (_mod(*SRV, "--pace", "-1"), ("--pace", "-1")),
    (_mod(*SRV, "--port", "70000"), ("--port", "70000")),
    (_mod(*SRV, "--host", "999.1.1.1"), ("--host", "999.1.1.1")),
    (_mod(*SRV, "--host", "bad host"), ("--host", "bad host")),
    (_mod(*SRV, "--mtu", "10"), ("--mtu", "10")),
    (_mod(*SRV, "--model", "abc"), ("--model", "abc")),
    (_mod(*SRV, "--peer-timeout", "0"), ("--peer-timeout", "0")),
    (_mod(*SRV, "--host", "127.0.0.1", "--port", BUSY, "--workers", "1"), ("--port", BUSY, "in use")),
    (_mod(*SRV, "--host", "192.0.2.1", "--workers", "1"), ("--host", "192.0.2.1")),
    # python -m dblp worker / loopback
    (_mod("dblp", "worker", "--server", "127.0.0.1:70000"), ("--server", "70000")),
    (_mod("dblp", "worker", "--server", "nohostport"), ("--server", "nohostport")),
    (_mod("dblp", "worker", "--server", "999.1.1.1:5"), ("--server", "999.1.1.1")),
    (_mod("dblp", "worker", "--server", "nonexistent.invalid:5"), ("--server", "nonexistent.invalid")),
    (_mod("dblp", "worker", "--server", "127.0.0.1:5,127.0.0.1:5"), ("--server", "names a server twice")),
    (_mod("dblp", "worker", "--server", "127.0.0.1:5,127.0.0.1:6", "--model", "1"), ("cannot be cut into 2 shards",)),
    (_mod(*SRV, "--shards", "0"), ("--shards", "0")),
    (_mod(*SRV, "--shards", "2", "--shard", "2"), ("--shard", "below --shards")),
    (_mod(*SRV, "--shards", "2", "--shard-hub", "hub"), ("--shard-hub", "hub")),
    (_mod("dblp", "loopback", "--aggregation", "ring"), ("--aggregation", "ring")),
    (_mod(*WRK, "--iterations", "0"), ("--iterations", "0")),
    (_mod(*WRK, "--compute", "-5"), ("--compute", "-5")),
    (_mod(*WRK, "--pace", "fast"), ("--pace", "fast")),
    (_mod(*WRK, "--id", "-2"), ("--id", "-2")),
    (_mod(*LB, "--workers", "0"), ("--workers", "0")),
    (_mod(*LB, "--p", "1"), ("--p", "1")),
    (_mod(*LB, "--iterations", "0"), ("--iterations", "0")),
    (_mod(*LB, "--warmup", "-1"), ("--warmup", "-1")),
    # python -m dblp.sim
    (_mod(*SIM, "--loss", "bernoulli:p=1.0"), ("--loss", "p=1")),
    (_mod(*SIM, "--loss", "1.0"), ("--loss", "p=1")),
    (_mod(*SIM, "--loss", "gilbert_elliott:p=0.1:r=0"), ("--loss", "gilbert_elliott")),
    (_mod(*SIM, "--loss", "iteration_bursts:at=1:loss=1"), ("--loss", "loss=1")),
    (_mod(*SIM, "--loss", "bernoulli:p=2"), ("--loss", "2")),
    (_mod(*SIM, "--loss", "nonsense"), ("--loss", "nonsense")),
    (_mod(*SIM, "--p-low", "2"), ("--p-low", "2")),
    (_mod(*SIM, "--p-low", "0.5", "--p-high", "0.1"), ("--p-high", "--p-low")),
    (_mod(*SIM, "--eta", "-1"), ("--eta", "-1")),
    (_mod(*SIM, "--freq", "0"), ("--freq", "0")),
    (_mod(*SIM, "--workers", "0"), ("--workers", "0")),
    (_mod("dblp.sim", "run", "--iterations", "0"), ("--iterations", "0")),
    (_mod(*SIM, "--compute", "-5"), ("--compute", "-5")),
    (_mod(*SIM, "--bandwidth", "0"), ("--bandwidth", "0")),
    (_mod(*SIM, "--norms", "/nonexistent.csv"), ("--norms", "/nonexistent.csv")),
    (_mod(*SIM, "--params", "/nonexistent.json"), ("/nonexistent.json",)),
    (_mod("dblp.sim", "sweep", "--eta", "-1", "--iterations", "3", "--out", "/nonexistent-sweep"), ("eta", "-1")),
    # python -m dblp.train worker
    (_mod(*TRN, "--id", "3", "--workers", "3"), ("--id", "3")),
    (_mod(*TRN, "--id", "0", "--workers", "0"), ("--workers", "0")),
    (_mod(*TRN, "--id", "0", "--workers", "1", "--epochs", "0"), ("--epochs", "0")),
    (_mod(*TRN, "--id", "0", "--workers", "1", "--lr", "-1"), ("--lr", "-1")),
    # python -m traces, python -m dblp.results.traceimport
    (_mod("traces", "generate", "bernoulli", "--loss", "2", "--packets", "10", "-o", "/tmp/x.pkts"), ("--loss", "2")),
    (_mod("traces", "generate", "bernoulli", "--loss", "0.1", "--packets", "0", "-o", "/tmp/x.pkts"), ("--packets", "0")),
    (_mod("traces", "generate", "onoff", "--duration=-1s", "-o", "/tmp/x.loss.csv"), ("--duration", "-1s")),
    (_mod("traces", "show", "/nonexistent.loss.csv", "--no-plot"), ("/nonexistent.loss.csv",)),
    (_mod("traces", "generate", "bernoulli", "--loss", "0.1", "--packets", "10", "--seed", "-1", "-o", "/tmp/x.pkts"),
     ("--seed", "-1")),
    (_mod(*SIM, "--seed", "-1"), ("--seed", "-1")),
    (_mod(*SIM, "--model", "1e13"), ("--model", "10000000000000")),
    (_mod(*SIM, "--out", "/proc/no/such/folder"), ("/proc/no",)),
    (_mod(*SRV, "--records", "/proc/no/such/file", "--port", "0", "--workers", "1"), ("/proc/no",)),
    (_mod(*WRK, "--norms", "/nonexistent.csv"), ("/nonexistent.csv",)),
    (_mod("dblp.results.traceimport", "--received", "/nonexistent.pcap", "--port", "70000", "-o", "/tmp/x.pkts"),
     ("--port", "70000")),
    (_mod("dblp.results.traceimport", "--received", "/nonexistent.pcap", "--expected-chunks", "0", "-o", "/tmp/x.pkts"),
     ("--expected-chunks", "0")),
    # python -m emulation.*
    (_mod("emulation.udptool", "send", "--dst", "999.1.1.1", "--port", "5"), ("--dst", "999.1.1.1")),
    (_mod("emulation.udptool", "send", "--dst", "127.0.0.1", "--port", "70000"), ("--port", "70000")),
    (_mod("emulation.udptool", "send", "--dst", "127.0.0.1", "--port", "5", "--count", "0"), ("--count", "0")),
    (_mod("emulation.udptool", "recv", "--port", UDP_BUSY, "--deadline", "1s"), ("--port", UDP_BUSY, "in use")),
    (_mod("emulation.hosts", "check", "/nonexistent.toml"), ("/nonexistent.toml",)),
    (_mod("emulation.hosts", "worker", "--server", "a:1", "--out", "/tmp/x", "--iterations", "0"),
     ("--iterations", "0")),
    (_mod("emulation.cleanup", "--bogus"), ("--bogus",)),
    # scenarios (the Mininet ones refuse before Mininet is built, root or not)
    (_scn("microburst.py", "--p-low", "2"), ("--p-low", "2")),
    (_scn("microburst.py", "--p-low", "-0.1"), ("--p-low", "-0.1")),
    (_scn("microburst.py", "--p-low", "0.5", "--p-high", "0.1"), ("--p-high", "--p-low")),
    (_scn("microburst.py", "--p-low", "0.7"), ("--p-high", "1.1")),
    (_scn("microburst.py", "--eta", "-1"), ("--eta", "-1")),
    (_scn("microburst.py", "--target-accuracy", "94"), ("--target-accuracy", "94", "0.94")),
    (_scn("microburst.py", "--eval-every", "0"), ("--eval-every", "0")),
    (_scn("microburst.py", "--seeds", "0"), ("--seeds", "0")),
    (_scn("clr_sweep.py", "--etas", "0.1,-2"), ("--etas", "-2")),
    (_scn("clr_sweep.py", "--freqs", "5,0"), ("--freqs", "5,0")),
    (_scn("clr_sweep.py", "--policies", "dblp"), ("--policies", "baseline")),
    (_scn("microburst.py", "--freq", "0"), ("--freq", "0")),
    (_scn("microburst.py", "--iterations", "0"), ("--iterations", "0")),
    (_scn("microburst.py", "--workers", "0"), ("--workers", "0")),
    (_scn("microburst.py", "--mtu", "100"), ("--mtu", "100", "576")),
    (_scn("microburst.py", "--mtu", "auto"), ("--mtu", "'auto' is not a number of bytes", "dblp server/loopback")),
    (_scn("trace_replay.py", "--mtu", "70000"), ("--mtu", "70000")),
    (_scn("microburst.py", "--bursts", "abc"), ("--bursts", "abc")),
    (_scn("microburst.py", "--bursts", "5,500"), ("--bursts", "500")),
    (_scn("microburst.py", "--burst-loss", "1"), ("--burst-loss", "1")),
    (_scn("microburst.py", "--compute", "-5"), ("--compute", "-5")),
    (_scn("microburst.py", "--bandwidth", "0"), ("--bandwidth", "0")),
    (_scn("microburst.py", "--pace-share", "-1"), ("--pace-share", "-1")),
    (_scn("microburst.py", "--pace-share", "fast"), ("--pace-share", "fast")),
    (_scn("microburst.py", "--policies", "bogus"), ("--policies", "bogus")),
    (_scn("trace_replay.py", "--trace", "/nonexistent.loss.csv"), ("--trace", "/nonexistent.loss.csv")),
    (_scn("trace_replay.py", "--time-scale", "0"), ("--time-scale", "0")),
    (_scn("trace_replay.py", "--p-low", "2"), ("--p-low", "2")),
    (_scn("crosscheck.py", "--params", "/nonexistent.json"), ("--params", "/nonexistent.json")),
    (_scn("crosscheck.py", "--calibrate-from", "reliable"), ("--calibrate-from", "reliable")),
    (_scn("crosscheck.py", "--eta", "-1"), ("--eta", "-1")),
    (_scn("train.py", "--p-low", "2"), ("--p-low", "2")),
    (_scn("train.py", "--workers", "0"), ("--workers", "0")),
    (_scn("train.py", "--epochs", "0"), ("--epochs", "0")),
    (_scn("train.py", "--loss", "1"), ("--loss", "1")),
    (_scn("train.py", "--workload", "nosuch"), ("--workload", "nosuch")),
    (_scn("train.py", "--target-accuracy", "94"), ("--target-accuracy", "94")),
    (_scn("train.py", "--seeds", "0"), ("--seeds", "0")),
    (_scn("train.py", "--eval-every", "-3"), ("--eval-every", "-3")),
    (_scn("trace_replay.py", "--seeds", "0"), ("--seeds", "0")),
    (_scn("benchmark.py", "--iterations", "0", "--dry-run"), ("--iterations", "0")),
    (_scn("benchmark.py", "--p", "2", "--dry-run"), ("--p", "2")),
    (_scn("benchmark.py", "--mtu", "10", "--dry-run"), ("--mtu", "10")),
    (_scn("benchmark.py", "--targets", "--target-sets", "gpu", "--dry-run"), ("--target-sets", "gpu")),
    (_mod("dblp.train.ddpbench", "--ranks", "0"), ("--ranks", "0")),
    (_mod("dblp.train.ddpbench", "--policy", "fast"), ("--policy", "fast")),
    (_mod("dblp.train.ddpbench", "--hostlocal", "maybe"), ("--hostlocal", "maybe")),
    (_scn("benchmark.py", "--targets", "--repeats", "0", "--dry-run"), ("--repeats", "0")),
    (_scn("gloo_allreduce.py", "--rank", "3", "--world-size", "2", "--init", "tcp://127.0.0.1:1"), ("--rank", "3")),
    (_scn("gloo_allreduce.py", "--rank", "0", "--world-size", "2", "--init", "tcp://127.0.0.1:70000"),
     ("--init", "70000")),
    (_scn("gpu_hosts.py", "/nonexistent.toml"), ("/nonexistent.toml",)),
    (_scn("phase_sensitivity.py", "--workers", "0"), ("--workers", "0")),
    (_scn("phase_sensitivity.py", "--drops", "2"), ("--drops", "2")),
    (_scn("bench_sim.py", "--iterations", "0"), ("--iterations", "0")),
    (_scn("bench_sim.py", "--only-targets", "--targets", "star64,bogus"), ("--targets", "bogus")),
    (_scn("sweep.py", "--eta", "-1", "--iterations", "3", "--out", "/nonexistent-sweep"), ("eta", "-1")),
]


def _id(case: tuple[list[str], tuple[str, ...]]) -> str:
    argv = case[0]
    if argv[1] == "-m":
        return " ".join(argv[2:])[:80]
    return " ".join([Path(argv[1]).name, *argv[2:]])[:80]


def _kernel_state() -> set[str]:
    """Network namespaces and nftables tables (what a started Mininet run would add), one line each."""
    def out(cmd: list[str]) -> list[str]:
        if shutil.which(cmd[0]) is None:
            return []
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return [f"{cmd[0]}: {line.strip()}" for line in r.stdout.splitlines() if line.strip()]

    return set(out(["ip", "netns", "list"]) + out(["nft", "list", "tables"]))


def _made_by_another(entry: str, pid: int) -> bool:
    """Whether a namespace or table names a live process other than ``pid`` as its creator (every
    testbed name carries its creator's pid), so that a test running beside this one is not blamed."""
    return any(int(t) != pid and Path(f"/proc/{t}").exists() for t in re.findall(r"\d+", entry))


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_bad_value_is_refused_by_name(case: tuple[list[str], tuple[str, ...]]) -> None:
    argv, words = case
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", DBLP_NO_REEXEC="1")
    root = os.geteuid() == 0 and "scenarios" in " ".join(argv)
    before = _kernel_state() if root else set()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                         stdin=subprocess.DEVNULL)
    try:
        stdout, stderr = p.communicate(timeout=TIMEOUT_S)
    finally:
        p.kill()
    assert "Traceback" not in stderr, stderr
    assert p.returncode == 2, (p.returncode, stdout[-2000:], stderr[-2000:])
    for w in words:
        assert w in stderr, (w, stderr[-2000:])
    if root:
        added = {e for e in _kernel_state() - before if not _made_by_another(e, p.pid)}
        assert not added, f"a refused scenario left namespaces or nft tables: {sorted(added)}"


INVENTORY = """
[run]
transport = "local"
policies = ["baseline", "dblp"]
{run}
[[hosts]]
name = "ps"
role = "server"
[[hosts]]
name = "w1"
role = "worker"
{host}
"""


@pytest.mark.parametrize("run, host, words", [
    ("p_low = 2.0", "", ("run.p_low", "2.0")),
    ("p_low = 0.5\np_high = 0.1", "", ("run.p_high", "0.1")),
    ("eta = -1.0", "", ("run.eta", "-1.0")),
    ("freq = 0", "", ("run.freq", "0")),
    ("port = 70000", "", ("run.port", "70000")),
], ids=["p_low", "p_high<p_low", "eta", "freq", "port"])
def test_inventory_bad_values_are_refused_by_field(tmp_path: Path, run: str, host: str,
                                                    words: tuple[str, ...]) -> None:
    inv = tmp_path / "inv.toml"
    inv.write_text(INVENTORY.format(run=run, host=host))
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run(_mod("emulation.hosts", "check", str(inv)), capture_output=True, text=True,
                       timeout=TIMEOUT_S, cwd=ROOT, env=env)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, (r.stdout, r.stderr)
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_inventory_refuses_an_undeliverable_loss_and_a_bad_address() -> None:
    """A host's loss rule that drops everything, and an address that is no host (ssh inventory)."""
    from emulation.hosts import InventoryError, parse_inventory

    base = {"run": {"transport": "ssh"}, "defaults": {"workdir": "/opt/dblp"},
            "hosts": [{"name": "ps", "role": "server", "address": "10.0.0.1"},
                      {"name": "w1", "role": "worker", "address": "10.0.0.2"}]}
    bad_loss = {**base, "hosts": [base["hosts"][0], {**base["hosts"][1], "loss": [{"kind": "bernoulli", "p": 1.0}]}]}
    with pytest.raises(InventoryError, match=r"hosts\[1\]\.loss\[0\].*p=1"):
        parse_inventory(bad_loss, "inv.toml")
    bad_addr = {**base, "hosts": [base["hosts"][0], {**base["hosts"][1], "address": "999.1.1.1"}]}
    with pytest.raises(InventoryError, match=r"hosts\[1\]\.address.*999\.1\.1\.1"):
        parse_inventory(bad_addr, "inv.toml")
    parse_inventory(base, "inv.toml")  # the good one parses


def test_trace_with_a_timestamp_beyond_int64_is_refused(tmp_path: Path) -> None:
    """``python -m traces show`` of a segments trace whose start time (or duration) exceeds 2**63 us."""
    sample = (ROOT / "traces" / "samples" / "onoff-lognormal.loss.csv").read_text().splitlines()
    head = sample[0]
    big_row = tmp_path / "row.loss.csv"
    big_row.write_text("\n".join([head, sample[1], "0,0.0", "99999999999999999999,0.5"]) + "\n")
    big_dur = tmp_path / "dur.loss.csv"
    big_dur.write_text("\n".join([head.replace('"duration_us":10000000,', '"duration_us":99999999999999999999,', 1),
                                  *sample[1:]]) + "\n")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    for f, word in ((big_row, "99999999999999999999"), (big_dur, "duration_us")):
        r = subprocess.run(_mod("traces", "show", str(f), "--no-plot"), capture_output=True, text=True,
                           timeout=TIMEOUT_S, cwd=ROOT, env=env)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 2 and word in r.stderr, (r.returncode, r.stderr)
