"""The targets' summary (dblp.results.targets): median and range over repeats, the bound of this machine's
class, the verdict - and ``scenarios/benchmark.py --targets`` end to end at a small size (a
subprocess: tests do not import scenarios; loopback only, no root)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.results.targets import TargetRow, as_rows, format_table, machine_class, plot, summarize
from dblp.transport.udp import auto_mtu

ROOT = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, str(ROOT / "scenarios" / "benchmark.py")]


def _rows(values: list[float]) -> list[list[TargetRow]]:
    return [[TargetRow("loopback 25M x 3: sharded / gloo", v, "x", {"2-core": 1.3, "16-core": 1.0}),
             TargetRow("DDP step", 10 * v, "ms", {"any": 1.0})] for v in values]


def test_median_range_and_the_bound_of_the_machine_class():
    assert machine_class(2) == "2-core" and machine_class(15) == "2-core" and machine_class(16) == "16-core"
    small = summarize(_rows([1.25, 1.9, 1.1]), cores=2)
    ratio, ddp = small
    assert (ratio["median"], ratio["min"], ratio["max"], ratio["repeats"]) == (1.25, 1.1, 1.9, 3)
    assert ratio["bound"] == 1.3 and ratio["met"] is True and ratio["elsewhere"] == {"16-core": 1.0}
    assert ddp["median"] == 12.5 and ddp["bound"] == 1.0 and ddp["met"] is False
    big = summarize(_rows([1.25, 1.9, 1.1]), cores=16)
    assert big[0]["bound"] == 1.0 and big[0]["met"] is False and big[0]["elsewhere"] == {"2-core": 1.3}
    # a row with no bound for this class is shown for information, with the other class's bound
    info = summarize([[TargetRow("25M x 8: sharded / gloo", 2.0, "x", {"16-core": 1.2})]], cores=2)[0]
    assert info["met"] is None and info["bound"] is None
    table = format_table(small + [info])
    assert "<= 1.30x" in table and "1.10x .. 1.90x" in table and "NOT met" in table
    assert "no target here (16-core: <= 1.20x)" in table and "+12.50 ms" in table


def test_rows_of_other_parts_plug_in_and_judge_themselves():
    rows = as_rows([{"target": "paced sender, 1 Gbit/s", "measured": 0.93, "threshold": 0.9, "met": True,
                     "better": ">="}, TargetRow("x", 1.0)])
    assert rows[0].bounds == {"any": 0.9} and rows[0].met is True and rows[1].name == "x"
    line = summarize([rows], cores=2)[0]
    assert line["met"] is True and line["median"] == 0.93
    with pytest.raises(ValueError, match="without measured"):
        as_rows([{"target": "t", "threshold": 1, "met": False}])
    with pytest.raises(ValueError, match="better"):
        TargetRow("t", 1.0, better="<")


def test_benchmark_targets_flag_refuses_bad_values_by_name():
    for bad, word in ((["--target-sets", "loopback,gpu"], "--target-sets"), (["--target-workers", "1"],
                      "--target-workers"), (["--target-model", "lots"], "--target-model")):
        r = subprocess.run([*BENCH, "--targets", *bad, "--dry-run"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and word in r.stderr, (bad, r.stderr[-500:])


def test_benchmark_targets_time_15_rounds_unless_told():
    """--targets medians 15 timed rounds a row (5 made the veth ratio spread 1.11-1.48x over 3 repeats);
    the plain benchmark keeps 5, and --iterations wins over both."""
    def rounds(*flags: str) -> int:
        r = subprocess.run([*BENCH, *flags, "--dry-run"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr[-500:]
        return json.loads(r.stdout[r.stdout.index("{"):])["config"]["rounds"]

    assert (rounds("--targets"), rounds(), rounds("--targets", "--iterations", "4")) == (15, 5, 4)


@pytest.mark.timeout(300)
def test_benchmark_targets_loopback_rows_side_by_side(tmp_path):
    """Two repeats of the loopback targets at 100K x 2 workers: every ratio measured, with a median,
    a range and a verdict; the CSV holds the same lines."""
    r = subprocess.run([*BENCH, "--targets", "--target-sets", "loopback", "--target-model", "100000",
                        "--target-workers", "2", "--iterations", "2", "--repeats", "2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "cores (" in r.stdout and "2 repeat(s)" in r.stdout
    with open(tmp_path / "targets.csv") as fh:
        lines = list(csv.DictReader(fh))
    assert [ln["target"] for ln in lines] == ["loopback 100K x 2: sharded / gloo",
                                               "loopback 100K x 2: single server / gloo",
                                               "loopback 100K x 2: sharded / gloo at MTU 1500"]
    for ln in lines:
        assert ln["repeats"] == "2" and 0 < float(ln["min"]) <= float(ln["median"]) <= float(ln["max"])
    # the rows at the loopback default say which MTU --mtu auto chose (lo's, capped)
    details = {d["target"]: d["detail"] for d in json.loads((tmp_path / "targets.json").read_text())["targets"]}
    auto = f"MTU {auto_mtu('127.0.0.1')[0]}"
    assert all(d.endswith(auto) for d in details["loopback 100K x 2: sharded / gloo"])
    assert all(d.endswith(auto) for d in details["loopback 100K x 2: single server / gloo"])
    # (no bound at 2 workers: the figure has no row to show, but is written all the same)
    assert (tmp_path / "targets.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_repeat_is_left_out_and_a_never_measured_target_says_so():
    nan = float("nan")
    lines = summarize([[TargetRow("a", 1.5, "x", {"any": 1.3}), TargetRow("b", nan, "x", {"any": 1.0})],
                       [TargetRow("a", nan, "x", {"any": 1.3}), TargetRow("b", nan, "x", {"any": 1.0})],
                       [TargetRow("a", 1.1, "x", {"any": 1.3}), TargetRow("b", nan, "x", {"any": 1.0})]], cores=2)
    a, b = lines
    assert a["repeats"] == 2 and a["median"] == 1.3 and (a["min"], a["max"]) == (1.1, 1.5) and a["met"] is True
    assert b["repeats"] == 0 and b["met"] is None
    table = format_table(lines)
    assert "(2 of 3)" in table and "not measured" in table


def test_plot_writes_a_png(tmp_path):
    lines = summarize(_rows([1.25, 1.9, 1.1]), cores=2)
    plot(lines, str(tmp_path / "t.png"), "title, load 1.0")
    assert (tmp_path / "t.png").stat().st_size > 5000


def test_plot_takes_a_difference_below_zero(tmp_path):
    """DBLP's DDP step can be faster than plain DDP's (-0.49 ms on a 2-core machine): a log axis has
    no place for it, so the plot switches to a symmetric log axis and says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = summarize([[TargetRow("ddp", -0.49, "ms", {"any": 1.0})], [TargetRow("ddp", 0.8, "ms", {"any": 1.0})],
                       [TargetRow("ddp", 2.1, "ms", {"any": 1.0})]], cores=2)
    seen = []
    real_savefig = plt.Figure.savefig

    def spy(fig, *a, **kw):
        seen.append((fig.axes[0].get_xscale(), fig.axes[0].get_xlim(), fig.axes[0].get_xlabel()))
        return real_savefig(fig, *a, **kw)

    plt.Figure.savefig = spy
    try:
        plot(lines, str(tmp_path / "t.png"), "title, load 1.0")
    finally:
        plt.Figure.savefig = real_savefig
    (scale, (lo, hi), label), = seen
    assert scale == "symlog" and lo < -0.49 and hi > 2.1 and "symmetric log" in label
    assert (tmp_path / "t.png").stat().st_size > 5000


def test_a_repeat_runs_every_group_and_a_failing_group_says_so(tmp_path, monkeypatch):
    """emulation.speedtargets: one repeat measures the groups asked for in order; a group that fails
    is one "not measured" row with its error, and the other groups still give theirs; the files of
    the repeats' summary hold the medians."""
    import argparse

    from emulation import speedtargets

    def broken(args, say, rep):
        raise RuntimeError("no gloo here")

    monkeypatch.setitem(speedtargets.TARGET_SOURCES, "ok", lambda args, say, rep: [TargetRow("t", 1.0 + rep, "x", {"any": 1.5})])
    monkeypatch.setitem(speedtargets.TARGET_SOURCES, "broken", broken)
    args = argparse.Namespace(target_sets=["broken", "ok"], out=tmp_path, rounds=3, ddp_steps=10)
    said: list[str] = []
    reps = [speedtargets.measure_repeat(args, said.append, rep, 2) for rep in range(2)]
    assert [[r.name for r in rows] for rows in reps] == [["broken targets", "t"]] * 2
    assert reps[0][0].detail == "no gloo here" and reps[1][1].value == 2.0
    assert said[:3] == ["repeat 1/2: broken targets", "broken targets: not measured in this repeat: no gloo here",
                        "repeat 1/2: ok targets"]
    table = speedtargets.write_targets(args, reps)
    assert "2 repeat(s), 3 timed rounds each" in table
    with open(tmp_path / "targets.csv") as fh:
        lines = {ln["target"]: ln for ln in csv.DictReader(fh)}
    assert (lines["t"]["median"], lines["t"]["min"], lines["t"]["max"], lines["t"]["met"]) == ("1.5", "1", "2", "True")
    assert lines["broken targets"]["repeats"] == "0"
    assert json.loads((tmp_path / "targets.json").read_text())["targets"][1]["median"] == 1.5
