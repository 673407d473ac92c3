"""Command lines: run, sweep (parallel, reproducible), calibrate (round trip)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.results.analysis import load_run
from dblp.protocol.records import read_records
from dblp.sim import SimConfig, simulate
from dblp.sim.studies.calibrate import calibrate
from dblp.sim.cli import main as cli_main
from dblp.sim.studies.sweep import main as sweep_main

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def test_help_of_every_entry_point():
    for args in (["-m", "dblp.sim", "--help"], ["-m", "dblp.sim", "run", "--help"],
                 ["-m", "dblp.sim", "sweep", "--help"], ["-m", "dblp.sim", "calibrate", "--help"],
                 [str(ROOT / "scenarios" / "sweep.py"), "--help"]):
        out = subprocess.run([PY, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "usage" in out.stdout


def test_run_writes_records_summary_and_plots(tmp_path, capsys):
    rc = cli_main(["run", "--model", "200000", "--iterations", "12", "--loss", "iteration_bursts:at=3,8:loss=0.7",
                   "--baseline", "--out", str(tmp_path)])
    assert rc == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"params.json", "records-dblp.jsonl", "records-baseline.jsonl", "summary.json", "latency.png",
            "cdf.png", "time.png", "rounds.csv"} <= names
    rows = (tmp_path / "rounds.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 12  # a header, then one row per run and iteration
    assert [r.split(",")[2] for r in rows[1:13]] == ["1" if k in (3, 8) else "0" for k in range(12)]  # bursts
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["baseline"]["lost_up"] < s["dblp"]["lost_up"]
    # params.json reproduces the run
    cfg = SimConfig.from_json(tmp_path / "params.json")
    again = simulate(cfg).summary()
    assert again["mean_round_s"] == s["dblp"]["mean_round_s"]
    assert "baseline/dblp" in capsys.readouterr().out


def test_run_keeps_records_gzipped_or_not_at_all(tmp_path, capsys, monkeypatch):
    """--record-format jsonl.gz: the same records, read back by suffix, in fewer bytes; none: no records
    file, the same summary and rounds.csv. A big plain file says how to keep it smaller."""
    import dblp.sim.cli as sim_cli

    base = ["run", "--model", "200000", "--iterations", "12", "--loss", "iteration_bursts:at=3,8:loss=0.7"]
    monkeypatch.setattr(sim_cli, "BIG_RECORDS_BYTES", 10_000)  # (100 MB in earnest)
    assert cli_main(base + ["--out", str(tmp_path / "plain")]) == 0
    assert "MB of records; --record-format jsonl.gz compresses them" in capsys.readouterr().out
    assert cli_main(base + ["--out", str(tmp_path / "gz"), "--record-format", "jsonl.gz"]) == 0
    assert "MB of records" not in capsys.readouterr().out
    assert cli_main(base + ["--out", str(tmp_path / "none"), "--record-format", "none"]) == 0
    plain, gz = tmp_path / "plain" / "records-dblp.jsonl", tmp_path / "gz" / "records-dblp.jsonl.gz"
    assert [r.to_dict() for r in read_records(gz)] == [r.to_dict() for r in read_records(plain)]
    roles = [(r.role, r.worker) for r in read_records(gz) if r.round == 0]
    assert sorted(roles) == [(role, w) for role in ("server", "worker") for w in range(3)]  # per worker, both ends
    assert len(list(read_records(gz))) == 12 * 6
    assert gz.stat().st_size < plain.stat().st_size / 4
    assert not list((tmp_path / "none").glob("records-*"))
    assert (tmp_path / "none" / "rounds.csv").read_text() == (tmp_path / "plain" / "rounds.csv").read_text()
    simulated = [{k: v for k, v in json.loads((tmp_path / d / "summary.json").read_text())["dblp"].items()
                  if k not in ("wall_s", "iterations_per_s")} for d in ("none", "plain")]  # (the CPU's seconds)
    assert simulated[0] == simulated[1]
    # the analyses find the gzipped records in the folder and label them by file
    assert {r.run for r in load_run(tmp_path / "gz")} == {"dblp"}
    _, notes = calibrate(tmp_path / "gz")  # and so does the calibration (dblp.results.runfolder.record_files)
    assert notes["record_files"] == [str(gz)] and notes["records"] == 12 * 6
    # a gzip file cut short is refused by name, not with a traceback of the gzip module
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut.jsonl.gz: a gzip file cut short \(after line \d+\)"):
        list(read_records(cut))
    plain_named_gz = tmp_path / "plain.jsonl.gz"
    plain_named_gz.write_bytes(plain.read_bytes())
    with pytest.raises(ValueError, match="plain.jsonl.gz: not a gzip file"):
        list(read_records(plain_named_gz))


def test_bad_parameters_exit_2_with_the_name(capsys):
    assert cli_main(["run", "--iterations", "2", "--p-high", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "--p-high" in err or "p_high" in err  # the flag (or the parameter) is named
    with pytest.raises(SystemExit):
        cli_main(["run", "--loss", "bernoulli:p"])


def test_sweep_is_parallel_reproducible_and_plots(tmp_path):
    args = ["--model", "200000", "--iterations", "30", "--p-high", "0.2,0.4", "--eta", "0.3,0.7",
            "--burst-rate", "0.1", "--quiet"]
    assert sweep_main(args + ["--jobs", "2", "--out", str(tmp_path / "a")]) == 0
    assert sweep_main(args + ["--jobs", "1", "--out", str(tmp_path / "b")]) == 0
    a = (tmp_path / "a" / "sweep.csv").read_text()
    assert a == (tmp_path / "b" / "sweep.csv").read_text()
    lines = a.splitlines()
    assert len(lines) == 1 + 4
    header = lines[0].split(",")
    for col in ("p_high", "eta", "burst_rate", "dblp_mean_round_s", "base_p99_round_s", "dblp_time_to_train_s",
                "base_lost", "speedup_mean", "speedup_time_to_train"):
        assert col in header
    for m in ("mean_round_s", "p99_round_s", "time_to_train_s", "lost_applied"):  # the lost map: 1 - up x down
        assert (tmp_path / "a" / f"heatmap_{m}.png").stat().st_size > 1000
    meta = json.loads((tmp_path / "a" / "sweep.json").read_text())
    assert meta["runs"] == 4 + 1  # the baseline is shared by the four DBLP points


def _fake_emulation_run(folder: Path, truth: SimConfig) -> None:
    (folder / "records").mkdir(parents=True)
    res = simulate(truth, records=str(folder / "records" / "server.jsonl"))
    assert res.records
    (folder / "config.json").write_text(json.dumps({"topology": {"bw": truth.bandwidth_bps / 1e6,
                                                                 "delay": "100us", "buffer_pkts": 100},
                                                    "_run": {"host": "x"}}))
    # the injector's log of an iteration burst
    events = [{"event": "start", "t": 1000.0},
              {"event": "apply", "t": 1001.0, "burst": 0, "kind": "iteration", "iteration": 9, "loss": 0.7},
              {"event": "remove", "t": 1001.5, "burst": 0, "kind": "iteration", "iteration": 10}]
    (folder / "bursts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    with open(folder / "records" / "server.jsonl", "a") as fh:
        fh.write("not json\n")


def test_calibrate_round_trip(tmp_path, capsys):
    truth = SimConfig(model=1_000_000, rounds=25, bandwidth_bps=1e9, send_pps=40_000, server_send_pps=150_000,
                      compute_s=0.02, reduce_s=0.002, delay_s=100e-6,
                      loss=[{"kind": "iteration_bursts", "at": [9], "loss": 0.7}])
    run = tmp_path / "run"
    _fake_emulation_run(run, truth)
    cfg, notes = calibrate(run)
    assert notes["skipped_lines"] == 1
    assert cfg.bandwidth_bps == truth.bandwidth_bps and cfg.delay_s == pytest.approx(truth.delay_s)
    assert cfg.send_pps == pytest.approx(truth.send_pps, rel=0.03)
    assert cfg.compute_s == pytest.approx(truth.compute_s, rel=0.02)
    assert cfg.loss == [{**truth.loss[0], "length": 1}] and cfg.policy == "dblp"
    assert len(cfg.norms) == truth.rounds
    a, b = simulate(truth).summary(), simulate(cfg).summary()
    for k in ("mean_round_s", "p99_round_s", "time_to_train_s"):
        assert b[k] == pytest.approx(a[k], rel=0.03), k
    # the command line writes a params file that `run --params` takes
    out = tmp_path / "params.json"
    assert cli_main(["calibrate", str(run), "-o", str(out)]) == 0
    assert "_calibration" in json.loads(out.read_text())
    assert cli_main(["run", "--params", str(out), "--iterations", "3"]) == 0


def test_calibrate_reads_the_run_config_above_a_policy_folder(tmp_path):
    truth = SimConfig(model=200_000, rounds=8, bandwidth_bps=1e9, send_pps=40_000)
    (tmp_path / "baseline" / "records").mkdir(parents=True)
    simulate(truth, records=str(tmp_path / "baseline" / "records" / "server.jsonl"))
    (tmp_path / "config.json").write_text(json.dumps({"bw": 1000, "buffer_pkts": 50}))
    cfg, notes = calibrate(tmp_path / "baseline")
    assert cfg.bandwidth_bps == 1e9 and cfg.queue_bytes == 50 * cfg.wire_bytes
    assert notes["config"].endswith("config.json")


def test_calibrate_refuses_an_empty_folder(tmp_path, capsys):
    assert cli_main(["calibrate", str(tmp_path), "-o", str(tmp_path / "p.json")]) == 2
    assert "no round records" in capsys.readouterr().err


def test_bare_bandwidth_is_mbit_and_bad_units_name_the_flag(capsys):
    from dblp.sim.cli import build_parser

    a = build_parser().parse_args(["run", "--bandwidth", "500", "--pace", "900M", "--compute", "5ms", "--queue", "100pkt"])
    assert a.bandwidth_bps == 500e6  # not 500 bit/s
    assert a.send_rate_bps == 900e6 and a.compute_s == pytest.approx(0.005) and a.queue_bytes == 100 * 1514
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--bandwidth", "5parsecs"])
    assert "argument --bandwidth" in capsys.readouterr().err


def test_a_bare_loss_probability_is_bernoulli():
    from dblp.sim.cli import build_parser

    a = build_parser().parse_args(["run", "--loss", "0.05", "--loss", "iteration_bursts:at=3:loss=0.7"])
    assert a.loss[0] == {"kind": "bernoulli", "p": 0.05} and a.loss[1]["kind"] == "iteration_bursts"


def test_bench_targets_run_each_in_a_fresh_process_and_say_met(tmp_path):
    """``bench_sim.py --only-targets`` (the scale targets): each run in its own process, its
    CPU time, peak memory and the run's own summary (the very numbers of ``simulate``), a verdict."""
    out = tmp_path / "t.json"
    p = subprocess.run([PY, "scenarios/bench_sim.py", "--only-targets", "--targets", "quick16", "--target-runs", "2",
                        "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (t,) = json.loads(out.read_text())["targets"]
    ref = simulate(SimConfig(model=1_000_000, workers=16, rounds=5)).summary()
    assert t["target"] == "quick16" and len(t["runs"]) == 2 and t["limit_s"] == 1.0
    for r in t["runs"]:
        assert r["up_passes"] == ref["up_passes"] and r["mean_round_s"] == ref["mean_round_s"]
        assert 0 < r["cpu_s"] < 60 and 0.01 < r["rss_gib"] < 12
    assert t["met"] == (t["median_cpu_s"] < 1.0)
    assert "target: 16 workers x 5 iterations" in p.stdout and "of 2 run(s)" in p.stdout


def test_bench_incast_prints_walk_and_flow_side_by_side(tmp_path):
    """``bench_sim.py --only-incast``: the first iteration walked and at flow level, each's CPU time, their
    ratio and the flow level's differences (dblp.sim.engines.incast.compare_first_iteration of the same runs)."""
    from dblp.sim.engines.incast import compare_first_iteration

    out = tmp_path / "i.json"
    p = subprocess.run([PY, "scenarios/bench_sim.py", "--only-incast", "--incast-workers", "8", "-o", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(out.read_text())["incast"]
    kw = dict(model=1_000_000, workers=8, rounds=1)
    ref = compare_first_iteration(simulate(SimConfig(incast="walk", **kw)), simulate(SimConfig(incast="flow", **kw)))
    assert row["workers"] == 8 and row["rel_diff"] == ref and row["ratio"] == row["walk_cpu_s"] / row["flow_cpu_s"]
    (line,) = [ln for ln in p.stdout.splitlines() if ln.lstrip().startswith("8 ")]
    assert f"passes {ref['passes']:+.2%}" in line and "received_frac +0.00%" in line


def test_unpaced_incast_collapse_warns_and_paced_does_not(tmp_path, capsys):
    """16 unpaced workers into a 1 Gbit/s server link: 3.58 passes per upload, so `run` prints the warning
    (the figure and --pace at the fair share 1000/16 = 62.5M) and summary.json records it; paced at 60M (just
    under the fair share) the same run needs 2.00 passes and gets none."""
    from dblp.sim.model import COLLAPSE_PASSES, collapse_warning

    flags = ["run", "--model", "200000", "--workers", "16", "--iterations", "10", "--bandwidth", "1000"]
    assert cli_main([*flags, "--summary", str(tmp_path / "unpaced.json")]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if "mass retransmission" in ln]
    assert "3.6 passes per upload" in line and "--pace 62.5M" in line and "1000 Mbit/s server link x 1 / 16" in line
    s = json.loads((tmp_path / "unpaced.json").read_text())["dblp"]
    assert s["clean_up_passes"] == pytest.approx(3.58, abs=0.01) and s["clean_up_passes"] > COLLAPSE_PASSES
    assert s["collapse_warning"] == line.split(": ", 1)[1]
    assert cli_main([*flags, "--pace", "60M", "--summary", str(tmp_path / "paced.json")]) == 0
    assert "mass retransmission" not in capsys.readouterr().out
    s = json.loads((tmp_path / "paced.json").read_text())["dblp"]
    assert s["collapse_warning"] is None and s["clean_up_passes"] == pytest.approx(2.0, abs=0.01)
    # the rule alone: bursts' own passes do not count, a paced config never warns
    cfg = SimConfig(workers=4, bandwidth_bps=1e9)
    assert collapse_warning(cfg, {"clean_up_passes": 2.5, "clean_down_passes": 1.0}).count("--pace 250M") == 1
    assert collapse_warning(cfg, {"clean_up_passes": 2.0, "clean_down_passes": 1.0}) is None
    assert collapse_warning(cfg.with_(send_rate_bps=250e6), {"clean_up_passes": 9.0}) is None
    assert collapse_warning(cfg, {}) is None  # a cached summary from before the clean_* fields
    # the sweep: one printed line, a column per point, the count in sweep.json
    assert sweep_main(["--model", "200000", "--workers", "16", "--bandwidth", "1000", "--p-high", "0.1,0.4",
                       "--eta", "0.5", "--burst-rate", "0.01", "--iterations", "10", "--out", str(tmp_path / "sw"),
                       "--no-cache", "-q", "--jobs", "1"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "collapsed" in ln]
    assert line.startswith("2 of 2 grid points collapsed (in 4 of their 4 DBLP/baseline runs") and "62.5M" in line
    assert json.loads((tmp_path / "sw" / "sweep.json").read_text())["collapsed_points"] == 2
