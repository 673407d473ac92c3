"""Records are strict JSON with a schema version and a run label; CSVs are numeric;
``python -m dblp.results.analysis compare A B`` prints two runs side by side and writes overlay plots.

The runs are small simulator runs (a second each), so the test needs no network."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dblp.results import analysis
from dblp.protocol.records import SCHEMA_VERSION, RoundRecord, merge_runs, read_records, write_records
from dblp.sim.config import SimConfig
from dblp.sim.model import simulate
from dblp.sim.options import baseline_of, parse_loss

ROOT = Path(__file__).resolve().parents[1]


def _strict(line: str) -> dict:
    """json.loads that rejects NaN/Infinity, as jq and browsers do."""
    def bad(c: str) -> None:
        raise ValueError(f"not JSON: {c}")
    return json.loads(line, parse_constant=bad)


def test_records_strict_json_round_trip(tmp_path: Path) -> None:
    rec = RoundRecord(source="x", role="worker", worker=1, round=3, up_latency_s=0.5, extra={"w": float("nan")})
    write_records(tmp_path / "r.jsonl", [rec])
    line = (tmp_path / "r.jsonl").read_text().splitlines()[0]
    d = _strict(line)
    assert list(d)[:2] == ["schema", "run"] and d["schema"] == SCHEMA_VERSION
    assert d["grad_norm"] is None and d["down_latency_s"] is None and d["extra"]["w"] is None
    back = next(read_records(tmp_path / "r.jsonl"))
    assert math.isnan(back.grad_norm) and math.isnan(back.down_latency_s) and back.up_latency_s == 0.5
    assert back.worker == 1 and back.round == 3


def test_schema0_lines_still_read_and_newer_refused(tmp_path: Path) -> None:
    old = {"source": "emulation", "role": "worker", "worker": 0, "round": 1, "grad_norm": float("nan"),
           "extra": {"run": "dblp", "burst": True}}
    (tmp_path / "old.jsonl").write_text(json.dumps(old) + "\n")  # NaN token, label in extra
    r = next(read_records(tmp_path / "old.jsonl"))
    assert r.run == "dblp" and r.extra == {"burst": True} and math.isnan(r.grad_norm)
    (tmp_path / "new.jsonl").write_text(json.dumps({**old, "schema": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(ValueError, match="newer"):
        list(read_records(tmp_path / "new.jsonl"))


def test_merge_runs_labels_top_level(tmp_path: Path) -> None:
    mk = lambda w: RoundRecord(source="x", role="worker", worker=w, round=0)  # noqa: E731
    merge_runs({"dblp": [mk(0)], "baseline": [mk(1)]}, tmp_path / "rounds.jsonl")
    lines = [_strict(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [(d["run"], d["worker"]) for d in lines] == [("baseline", 1), ("dblp", 0)]
    assert all("run" not in d["extra"] for d in lines)


def test_table_ii_is_numeric() -> None:
    s = analysis.LatencySummary([0.2], 0.3, 0.25, 0.1, 0.12, [3], 1.0)
    b = analysis.LatencySummary([0.4], 0.6, 0.5, 0.1, 0.24, [3], 1.0)
    rows = analysis.table_ii(b, s, [5])
    assert all(isinstance(x, float) for r in rows[1:] for x in r[1:])
    assert rows[3][1:] == pytest.approx([2.0, 2.0, 2.0, 2.0])
    text = analysis.format_table(rows)
    assert "2.0000" in text and "0.2000" in text


def _sim_run(folder: Path, loss: str | None) -> Path:
    """A results folder as ``python -m dblp.sim run --baseline --out`` writes it."""
    folder.mkdir(parents=True)
    cfg = SimConfig(model=100_000, rounds=12, loss=[parse_loss(loss)] if loss else [])
    for label, c in (("dblp", cfg), ("baseline", baseline_of(cfg))):
        simulate(c, records=str(folder / f"records-{label}.jsonl"))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cmp")
    return _sim_run(root / "calm", None), _sim_run(root / "bursty", "iteration_bursts:at=4,8:loss=0.7")


def test_compare_tables_and_plots(runs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, b = runs
    out = tmp_path / "out"
    rows = analysis.compare(a, b, out)
    text = capsys.readouterr().out
    assert "dblp / worker" in text and "baseline / server" in text and "send p99 (s)" in text
    keys = {(r["run"], r["role"]) for r in rows}
    assert keys == {("dblp", "worker"), ("dblp", "server"), ("baseline", "worker"), ("baseline", "server")}
    by = {(r["run"], r["role"], r["metric"]): r for r in rows}
    assert by[("dblp", "worker", "rounds")]["calm"] == 11  # round 0 is warm-up
    # the bursty run's bursts cost the reliable baseline extra passes; the calm run needs none
    assert by[("baseline", "worker", "passes max")]["bursty"] > by[("baseline", "worker", "passes max")]["calm"]
    for f in ("compare.csv", "latency_send.png", "cdf_send.png", "latency_round.png", "cdf_round.png"):
        assert (out / f).stat().st_size > 0, f
    with open(out / "compare.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            float(r["calm"]), float(r["bursty"])  # numeric (nan allowed), never "1.8x"


def test_compare_single_files_pair_up(runs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, b = runs
    rows = analysis.compare(a / "records-dblp.jsonl", b / "records-baseline.jsonl", None)
    assert {r["run"] for r in rows} == {"dblp|baseline"}


def test_cli_exit_codes(runs: tuple[Path, Path], tmp_path: Path) -> None:
    py = [sys.executable, "-m", "dblp.results.analysis"]
    for args in ([], ["A", "B"]):
        r = subprocess.run(py + args, capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 2 and "usage" in r.stderr.lower(), args
    r = subprocess.run(py + ["compare", str(tmp_path / "nope"), str(runs[0])], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2 and "nope" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(py + ["compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "o"), "--no-plot"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / "compare.csv").exists() and not (tmp_path / "o" / "cdf_send.png").exists()


def test_record_files_take_the_merged_file_else_every_records_file_but_the_burst_log(tmp_path: Path) -> None:
    """dblp.results.runfolder.record_files is where the analyses and the calibration look."""
    from dblp.results.runfolder import record_files

    mk = lambda w: RoundRecord(source="emulation", role="worker", worker=w, round=1, policy="dblp")  # noqa: E731
    write_records(tmp_path / "dblp" / "records" / "w0.jsonl", [mk(0)])
    write_records(tmp_path / "records-sim.jsonl.gz", [mk(1)])
    (tmp_path / "bursts.jsonl").write_text('{"event": "burst", "t": 1.0}\n')
    assert record_files(tmp_path) == [tmp_path / "dblp" / "records" / "w0.jsonl", tmp_path / "records-sim.jsonl.gz"]
    assert sorted((r.run, r.worker) for r in analysis.load_run(tmp_path)) == [("dblp", 0), ("sim", 1)]
    merge_runs({"dblp": [mk(0)]}, tmp_path / "rounds.jsonl")
    assert record_files(tmp_path) == [tmp_path / "rounds.jsonl"]
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "a.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match=r"a.jsonl:1: not a round record"):  # a lone file says what is wrong
        analysis.load_run(lone)


def test_load_run_labels_by_layout(tmp_path: Path) -> None:
    """A recorder's folder (<run>/<policy>/records/*.jsonl, plus records/ of its own) and a bursts log."""
    mk = lambda w, pol: RoundRecord(source="emulation", role="worker", worker=w, round=1, policy=pol)  # noqa: E731
    write_records(tmp_path / "dblp" / "records" / "w0.jsonl", [mk(0, "dblp")])
    write_records(tmp_path / "baseline" / "records" / "w0.jsonl", [mk(0, "fixed")])
    write_records(tmp_path / "records" / "w1.jsonl", [mk(1, "reliable")])
    (tmp_path / "bursts.jsonl").write_text('{"event": "burst", "t": 1.0}\n')
    got = sorted((r.run, r.worker) for r in analysis.load_run(tmp_path))
    assert got == [("", 1), ("baseline", 0), ("dblp", 0)]
    assert sorted(analysis.group_runs(analysis.load_run(tmp_path))) == [
        ("baseline", "worker"), ("dblp", "worker"), ("reliable", "worker")]
