"""The cross-check: its statistics and report (dblp.sim.studies.crosscheck, no root) and a small
Mininet-vs-simulator run of scenarios/crosscheck.py (a subprocess)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dblp.sim.studies import crosscheck
from dblp.protocol.records import RoundRecord

ROOT = Path(__file__).resolve().parents[2]


def _crosscheck(*args: str, timeout: float = 400, returncode: int = 0) -> subprocess.CompletedProcess[str]:
    """scenarios/crosscheck.py with ``args``, which ends with ``returncode``."""
    out = subprocess.run([sys.executable, str(ROOT / "scenarios" / "crosscheck.py"), *args], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == returncode, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _small_run(tmp_path: Path, iterations: int, burst: int, *fabric: str) -> Path:
    """A small Mininet cross-check (a 2e5 model, 200 Mbit/s, one burst at round ``burst``) on the
    fabric that ``fabric``'s flags name; its run folder."""
    _crosscheck("--model", "2e5", "--iterations", str(iterations), "--bursts", str(burst), "--bandwidth", "200",
                *fabric, "--results", str(tmp_path))
    (run,) = list(tmp_path.glob("crosscheck-*"))
    return run


def _ordinary_passes(run: Path, near: int) -> list[tuple[float, float]]:
    """Mean up passes over the ordinary rounds (not 0, nor the burst's 8 and 9) of the workers that
    are not ``near`` and of worker ``near``: in the Mininet records, then in the simulator's."""
    def side(recs: list[RoundRecord]) -> tuple[float, float]:
        ordinary = [r for r in recs if r.role == "worker" and r.round not in (0, 8, 9)]
        return (float(np.mean([r.up_passes for r in ordinary if r.worker != near])),
                float(np.mean([r.up_passes for r in ordinary if r.worker == near])))

    return [side([RoundRecord.from_dict(json.loads(x)) for f in (run / "baseline" / "records").glob("worker*.jsonl")
                  for x in f.read_text().splitlines()]),
            side([RoundRecord.from_dict(json.loads(x))
                  for x in (run / "sim" / "baseline.jsonl").read_text().splitlines()])]


def test_ks_numpy_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for shift in (0.0, 0.3, 1.0):
        a, b = rng.normal(size=80), rng.normal(shift, 1.2, size=120)
        d, p = crosscheck.ks_2samp_numpy(a, b)
        ref = scipy_stats.ks_2samp(a, b)
        assert d == pytest.approx(ref.statistic, abs=1e-12)
        assert p == pytest.approx(ref.pvalue, abs=0.05)


def _recs(lat: list[float], frac: float = 1.0, chunks: int = 100) -> list[RoundRecord]:
    return [RoundRecord(source="x", role="worker", worker=w, round=k, round_latency_s=v * (1 + 0.01 * w),
                        up_latency_s=v / 2, chunks=chunks, up_received=int(frac * chunks), down_received=chunks,
                        up_passes=1) for k, v in enumerate(lat) for w in range(3)]


def test_compare_relative_errors_and_speedups(tmp_path):
    base = [1.0] * 20
    base[10] = 5.0
    dblp = [0.5] * 20
    dblp[10] = 2.0
    real = {"baseline": _recs(base), "dblp": _recs(dblp, 0.6)}
    sim = {"baseline": _recs([1.1 * x for x in base]), "dblp": _recs([x for x in dblp], 0.6)}
    cmp = crosscheck.compare(real, sim, [10])
    rows = {(r["term"], r["policy"]): r for r in cmp["rows"]}
    assert rows[("round p50", "baseline")]["rel_err"] == pytest.approx(0.10)
    assert rows[("round p50", "baseline")]["within"] is True
    assert rows[("round p50", "dblp")]["rel_err"] == pytest.approx(0.0)
    sp = rows[("speedup round @10", "baseline/dblp")]
    assert sp["mininet"] == pytest.approx(2.5) and sp["sim"] == pytest.approx(2.75) and sp["within"] is True
    assert rows[("recv frac @10", "dblp")]["mininet"] == pytest.approx(0.6)
    # every sim value 10% higher: the 18 ordinary iterations separate completely, the burst ones do not
    assert cmp["ks"]["baseline round"]["statistic"] == pytest.approx(18 / 19)
    crosscheck.write_report(cmp, tmp_path, "test", [10])
    doc = json.loads((tmp_path / "crosscheck.json").read_text())
    assert "round p50 (baseline)" not in doc["outside_bounds"]
    assert (tmp_path / "crosscheck.png").stat().st_size > 0 and (tmp_path / "crosscheck.csv").exists()


@pytest.mark.mininet
def test_small_crosscheck_run(tmp_path):
    run = _small_run(tmp_path, 20, 12)
    doc = json.loads((run / "crosscheck.json").read_text())
    terms = {(r["term"], r["policy"]) for r in doc["rows"]}
    for t in [("round p50", "baseline"), ("round p99", "dblp"), ("speedup round @12", "baseline/dblp"),
              ("recv frac @12", "dblp")]:
        assert t in terms
    assert all(0 <= v["statistic"] <= 1 for v in doc["ks"].values())
    assert all(math.isfinite(r["rel_err"]) for r in doc["rows"] if r["term"].startswith("round p"))
    for f in ("crosscheck.png", "crosscheck.csv", "calibration.json", "sim/params.json", "sim/baseline.jsonl",
              "sim/dblp.jsonl"):
        assert (run / f).stat().st_size > 0
    # the same run, re-analysed without Mininet, with its own calibration transferred
    _crosscheck("--from-run", str(run), "--params", str(run / "calibration.json"), timeout=200)
    assert "transferred" in json.loads((run / "transferred" / "crosscheck.json").read_text())["how"]
    assert "calibrated on this run" in json.loads((run / "crosscheck.json").read_text())["how"]
    # a run it cannot calibrate (here: no worker records left) gets one line, not a traceback
    bare = tmp_path / "bare"
    shutil.copytree(run, bare)
    for f in bare.glob("*/records/worker*.jsonl"):
        f.unlink()
    cant = _crosscheck("--from-run", str(bare), timeout=200, returncode=1)
    assert "Traceback" not in cant.stderr
    (line,) = cant.stderr.strip().splitlines()
    assert line.startswith(f"crosscheck: cannot calibrate the simulator on {bare}: ") and "no worker records" in line


@pytest.mark.mininet
def test_small_leafspine_crosscheck_run(tmp_path):
    """Rack 2's two workers (60 Mbit/s each) share a 100 Mbit/s uplink: in Mininet and in the
    simulator calibrated on the run (which reads the fabric from its config) they need more
    passes than the worker in the server's rack."""
    run = _small_run(tmp_path, 12, 8, "--topology", "leafspine", "--racks", "2", "--uplink-bandwidth", "100")
    cal = json.loads((run / "calibration.json").read_text())
    assert (cal["topology"], cal["racks"], cal["uplink_bandwidth_bps"]) == ("leafspine", 2, 100e6)
    for far, near in _ordinary_passes(run, near=1):  # w1 and w3: rack 2; w2: the server's rack
        assert far > near == 1.0


@pytest.mark.mininet
def test_small_twosites_crosscheck_run(tmp_path):
    """Two sites: the two remote workers (60 Mbit/s each) share a 100 Mbit/s WAN and need a second pass
    in Mininet and in the simulator calibrated on the run (which reads the fabric from its config);
    the worker in the server's site needs one."""
    run = _small_run(tmp_path, 12, 8, "--topology", "twosites", "--local-workers", "1", "--wan-bandwidth", "100")
    cal = json.loads((run / "calibration.json").read_text())
    assert (cal["topology"], cal["local_workers"], cal["wan_bandwidth_bps"]) == ("twosites", 1, 100e6)
    for remote, local in _ordinary_passes(run, near=0):  # w2 and w3: site 2; w1: the server's site
        assert remote > 1.5 and local == 1.0


def _sim_run_folder(tmp_path: Path, name: str = "crosscheck-fixture", mbps: float = 200.0, rounds: int = 20,
                    fabric: dict | None = None, **hosts: float) -> Path:
    """A crosscheck run folder (config.json, <policy>/records/) whose 'emulated' records are the simulator's
    own: enough for --from-run, no root. ``fabric``: the run's --topology flags and their SimConfig keys;
    ``hosts``: SimConfig's host constants of the 'emulated' hosts (default: the SimConfig's)."""
    from dblp.sim import SimConfig

    run = tmp_path / name
    flags, keys = fabric or ({"topology": "star", "racks": 2, "uplink_bandwidth": None}, {})
    cfg = SimConfig(model=200_000, workers=3, rounds=rounds, bandwidth_bps=mbps * 1e6, queue_bytes=151_400, seed=0,
                    send_rate_bps=0.9 * mbps * 1e6 / 3, compute_s=0.005, wire=2,
                    loss=[{"kind": "iteration_bursts", "at": [12], "loss": 0.7}], **keys, **hosts)
    crosscheck.simulate_policies(cfg, ["baseline", "dblp"], 0.008, 0.408, tmp_path / f"made-{name}")
    config = {"model": "2e5", "iterations": rounds, "policies": "baseline,dblp", "p_low": 0.008, "p_high": 0.408,
              "eta": 0.5, "freq": 10, "workers": 3, "bandwidth": mbps * 1e6, "queue": 151_400, "pace_share": 0.9,
              "compute": 0.005, "gso": False, "mtu": 1500, "seed": 0, "insecure": False, "aggregation": "server",
              "bursts": "12", "burst_loss": 0.7, "burst_kind": "drop", "hosts": "netns", **flags,
              "policy_list": ["baseline", "dblp"], "elements": 200_000, "send_rate_bps": 0.9 * mbps * 1e6 / 3,
              "bw_mbps": mbps, "queue_bytes": 151_400, "bursts_list": [12], "hosts_kind": "netns"}
    for pol in ("baseline", "dblp"):
        (run / pol / "records").mkdir(parents=True)
        shutil.copy(tmp_path / f"made-{name}" / f"{pol}.jsonl", run / pol / "records" / "rounds.jsonl")
    (run / "config.json").write_text(json.dumps(config))
    return run


def test_blind_prediction_from_a_star_calibration_reports_its_errors(tmp_path):
    """The blind path of the cross-check (docs/crosscheck.md): one star calibration on a run whose hosts bind (2 Gbit/s; 16,000 and
    30,000 datagrams/s), its calibration.json applied with --params to runs of other networks - a slow
    star (100 Mbit/s: the pacers bind) and two sites (two local workers, one behind a 60 Mbit/s WAN). The 'emulated'
    records are the simulator's own with the same hosts, so every bounded term comes out within 5%;
    before host and network were separated, the 2 Gbit/s calibration's hosts were its own pacing and
    link rates."""
    hosts = {"send_pps": 16_000.0, "server_send_pps": 30_000.0}
    star = _sim_run_folder(tmp_path, "star-2000", 2000.0, **hosts)
    _crosscheck("--from-run", str(star), timeout=300)
    (cal,) = star.glob("reanalysis-*/calibration.json")
    host = json.loads(cal.read_text())["_crosscheck"]["estimates"]["host"]
    assert host["worker"]["datagrams_per_s"] == pytest.approx(16_000, rel=0.03)
    assert host["server"]["datagrams_per_s"] == pytest.approx(30_000, rel=0.03)
    # config.json names flags as typed ("local-workers"); --from-run must read them, not keep its defaults
    two = ({"topology": "twosites", "local-workers": 2, "wan-bandwidth": 60e6},
           {"topology": "twosites", "local_workers": 2, "wan_bandwidth_bps": 60e6, "wan_delay_s": 0.0})
    for run in (_sim_run_folder(tmp_path, "star-100", 100.0, **hosts),
                _sim_run_folder(tmp_path, "twosites", 500.0, fabric=two, **hosts)):
        out = _crosscheck("--from-run", str(run), "--params", str(cal), timeout=300)
        assert "bounded terms within their bounds" in out.stdout
        doc = json.loads((run / "transferred" / "crosscheck.json").read_text())
        assert doc["how"].startswith("transferred from") and doc["outside_bounds"] == []
        assert doc["calibration"]["send_pps"] == pytest.approx(16_000, rel=0.03)
        bounded = [r for r in doc["rows"] if r["bound"] is not None]
        assert len(bounded) == 6  # round p50 and p99 of both policies, the round and send speedups at the burst
        assert all(abs(r["rel_err"]) < 0.05 for r in bounded), [(r["term"], r["rel_err"]) for r in bounded]
    assert doc["scenario"]["topology"] == "twosites" and doc["scenario"]["wan_bandwidth_bps"] == 60e6
    assert doc["scenario"]["local_workers"] == 2


def test_from_run_writes_beside_not_over(tmp_path):
    """--from-run without --params: the run's own report stays byte for byte; the re-analysis goes into a new
    reanalysis-<time>/ folder (a second one into another), and the command prints where."""
    run = _sim_run_folder(tmp_path)
    own = {"crosscheck.json": b'{"own": 1}', "crosscheck.csv": b"own", "calibration.json": b'{"own": 2}'}
    for name, body in own.items():
        (run / name).write_bytes(body)
    folders = []
    for _ in range(2):
        out = _crosscheck("--from-run", str(run), timeout=200)
        (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("crosscheck: report -> ")]
        folders.append(Path(line.split(" -> ", 1)[1]))
    assert folders[0] != folders[1] and all(f.parent == run and f.name.startswith("reanalysis-") for f in folders)
    assert sorted(p.name for p in run.glob("reanalysis-*")) == sorted(f.name for f in folders)
    for name, body in own.items():
        assert (run / name).read_bytes() == body
    assert not (run / "sim").exists()
    for f in folders:
        doc = json.loads((f / "crosscheck.json").read_text())
        assert doc["how"] == "calibrated on this run's baseline records"
        rows = {(r["term"], r["policy"]): r for r in doc["rows"]}
        assert rows[("round p50", "baseline")]["sim"] > 0
        for name in ("crosscheck.png", "crosscheck.csv", "calibration.json", "sim/params.json", "sim/dblp.jsonl"):
            assert (f / name).stat().st_size > 0
