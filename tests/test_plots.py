"""The flagship run's plots drawn from small synthetic records: each function writes its
PNG, and the numbers behind the figures (mean and range curves, bar positions, the compare caption,
per-iteration loss) are the expected ones. No network, about a second of matplotlib."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dblp.results import analysis
from dblp.protocol.records import RoundRecord, merge_runs
from dblp.results.trainreport import _bar_positions, curve_band, load_training, plot_curves, plot_training_time
from emulation.replayloss import datagram_loss_by_round, plot_loss


def _write_run(d: Path, evals: list[list[tuple[int, float, float]]], train_s: float = 10.0) -> None:
    """A training run's folder as dblp.train workers leave it (summary, epochs, evals per worker)."""
    for i, ev in enumerate(evals):
        w = d / f"w{i}"
        w.mkdir(parents=True)
        (w / "summary.json").write_text(json.dumps({"metric": "accuracy", "train_s": train_s, "exchange_s": 1.0,
                                                    "final_metric": ev[-1][2]}))
        (w / "epochs.jsonl").write_text(json.dumps({"epoch": 1, "iterations": ev[-1][0]}) + "\n")
        (w / "evals.jsonl").write_text("".join(json.dumps({"iteration": k, "train_s": t, "accuracy": v}) + "\n"
                                               for k, t, v in ev))


def _records(run: str, n: int, slow: dict[int, float], clr_until: int = -1) -> list[RoundRecord]:
    """Two workers and the server over ``n`` rounds: 100 ms sends, ``slow`` rounds slower; 100
    datagrams each way per worker, the slow rounds losing 10 of each."""
    out = []
    for k in range(n):
        lost = 10 if k in slow else 0
        for w in (0, 1):
            out.append(RoundRecord(source="x", role="worker", worker=w, round=k, run=run, policy=run, chunks=100,
                                   up_latency_s=slow.get(k, 0.1), round_latency_s=slow.get(k, 0.1) * 2,
                                   up_sent=100, up_passes=1, down_received=100 - lost))
            out.append(RoundRecord(source="x", role="server", worker=w, round=k, run=run, policy=run, chunks=100,
                                   up_latency_s=slow.get(k, 0.1), clr=k <= clr_until, down_sent=100,
                                   up_received=100 - lost))
    return out


def test_accuracy_plot_draws_the_workers_mean_and_their_range(tmp_path):
    _write_run(tmp_path / "s0" / "dblp", [[(5, 1.0, 0.80), (10, 2.0, 0.90)], [(5, 1.2, 0.70), (10, 2.2, 0.94)]])
    _write_run(tmp_path / "s1" / "dblp", [[(5, 1.1, 0.60), (10, 2.1, 0.92)], [(5, 1.3, 0.66), (10, 2.3, 0.96)]])
    one = load_training(tmp_path / "s0" / "dblp", 2)
    band = curve_band([one])
    assert [b[0] for b in band] == [5, 10]
    assert band[0][1:] == (1.2, pytest.approx(0.75), 0.70, 0.80)  # slowest clock, mean, worker range
    assert band[1][2:] == (pytest.approx(0.92), 0.90, 0.94)
    two = [one, load_training(tmp_path / "s1" / "dblp", 2)]
    band2 = curve_band(two)  # the median of the seeds' means, the range over all workers of all seeds
    assert band2[0][2:] == (pytest.approx((0.75 + 0.63) / 2), 0.60, 0.80)
    for runs, name in (({"dblp": one}, "one.png"), ({"dblp": two}, "seeds.png")):
        assert plot_curves(runs, tmp_path / name, "t", targets=[0.9]).stat().st_size > 10_000


def test_training_time_bars_are_centred_on_each_condition(tmp_path):
    conds = {"with bursts": {"reliable": 0, "baseline": 0, "dblp": 0}, "no bursts": {"baseline": 0, "dblp": 0}}
    pos = _bar_positions(conds, 0.2)
    assert [pos[(0, n)] for n in ("reliable", "baseline", "dblp")] == pytest.approx([-0.2, 0.0, 0.2])
    assert [pos[(1, n)] for n in ("baseline", "dblp")] == pytest.approx([0.9, 1.1])  # no empty reliable slot
    for n in ("reliable", "baseline", "dblp"):
        _write_run(tmp_path / n, [[(10, 1.0, 0.9)]], train_s={"reliable": 30.0, "baseline": 20.0}.get(n, 10.0))
    runs = {n: load_training(tmp_path / n, 1) for n in ("reliable", "baseline", "dblp")}
    real = {"with bursts": runs, "no bursts": {n: runs[n] for n in ("baseline", "dblp")}}
    assert plot_training_time(real, tmp_path / "t.png", "Training time").stat().st_size > 10_000


def test_latency_and_cdf_plots_mark_bursts_in_a_colour_no_run_uses(tmp_path):
    assert analysis.BURST_COLOR not in analysis.RUN_COLORS.values()
    runs = {"baseline": _records("baseline", 30, {16: 0.9}), "dblp": _records("dblp", 30, {16: 0.4}, clr_until=9)}
    assert analysis.plot_latency(runs, tmp_path / "l.png", [16], setup="consistency none").stat().st_size > 10_000
    assert analysis.plot_cdf(runs, tmp_path / "c.png").stat().st_size > 10_000


def test_compare_says_what_differs_and_marks_each_runs_bursts(tmp_path, capsys):
    for name, bursts, p_low in (("calm", "", 0.008), ("burst", "16", 0.01)):
        d = tmp_path / name
        d.mkdir()
        merge_runs({"dblp": _records("dblp", 30, {16: 0.4} if bursts else {}, clr_until=9)}, d / "rounds.jsonl")
        (d / "config.json").write_text(json.dumps({"bursts": bursts, "p_low": p_low, "workers": 2,
                                                   "results": str(d), "derived": {"bursts_list": [16] if bursts
                                                                                  else []}, "_run": {"host": "x"}}))
    ca, cb = analysis.run_config(tmp_path / "calm"), analysis.run_config(tmp_path / "burst" / "rounds.jsonl")
    assert analysis.config_diff(ca, cb) == ["bursts: (none) -> 16", "p_low: 0.008 -> 0.01"]
    assert (analysis.run_bursts(ca), analysis.run_bursts(cb)) == ([], [16])
    assert analysis.config_diff(ca, None) == ["no config.json with B: what differs is not recorded"]
    analysis.compare(tmp_path / "calm", tmp_path / "burst", tmp_path / "o")
    assert "differs (A -> B): bursts: (none) -> 16; p_low: 0.008 -> 0.01" in capsys.readouterr().out
    for f in ("latency_send.png", "cdf_send.png", "latency_round.png", "cdf_round.png"):
        assert (tmp_path / "o" / f).stat().st_size > 10_000, f


def test_packets_trace_loss_comes_from_the_records(tmp_path):
    runs = {"dblp": _records("dblp", 20, {7: 0.3})}
    loss = datagram_loss_by_round(runs["dblp"])
    assert loss[7] == pytest.approx(40 / 400) and loss[6] == 0.0  # 2 workers x 10 lost, each way
    assert plot_loss(runs, {"dblp": loss}, tmp_path / "loss.png", "x.pkts",
                     what="datagrams lost").stat().st_size > 10_000
