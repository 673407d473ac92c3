"""Accuracy per compensation mode in one process: the in-memory DBLP model, several seeds, no sockets.

The emulation measures time to accuracy with real sockets, links and bursts, minutes per run. This
is its fast companion for the accuracy side alone: simulated workers train a workload through
:class:`dblp.train.exchange.TolerancePolicyExchange` - the real sessions, policy and STOP rule, the
compensation's own arithmetic - under a burst schedule (a fraction of every transfer lost in the
burst iterations), and the table gives the iterations to each target and the final metric per mode,
median [min-max] over seeds. Iterations, not seconds: a round's duration is the emulation's (or the
simulator's) to measure.

    python -m dblp.train.modes --workload digits_mlp --modes paper,unbiased+fill-local,stop-once --seeds 3
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from dblp.cli.args import parse_targets
from dblp.protocol.compensation import Compensation
from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_P_LOW, default_p_high
from dblp.protocol.wire import ParameterError
from dblp.results.stats import median_range

BASELINE = "baseline"
RELIABLE = "reliable"


def burst_loss(bursts: Sequence[int], loss: float, width: int = 1) -> Any:
    """``f(step)``: ``loss`` in each burst iteration (and the ``width - 1`` after it), else 0."""
    on = {b + i for b in bursts for i in range(width)}
    return lambda step: loss if step in on else 0.0


def run_mode(workload: str, mode: str, seed: int, *, epochs: int, iters_per_epoch: int | None, workers: int,
             p_low: float, p_high: float, bursts: Sequence[int], loss: float, eval_every: int) -> dict[str, Any]:
    """One training run of ``mode`` (``reliable``, ``baseline``, or a DBLP compensation label)."""
    from dblp.train.exchange import TolerancePolicyExchange
    from dblp.train.loop import TrainConfig, train
    from dblp.train.models import get_workload

    wl = get_workload(workload, seed=seed)
    lossf = burst_loss(bursts, loss)
    if mode == RELIABLE:
        ex = TolerancePolicyExchange.fixed(0.0, seed=seed, loss=lossf)
    elif mode == BASELINE:
        ex = TolerancePolicyExchange.fixed(p_low, seed=seed, loss=lossf)
    else:
        ex = TolerancePolicyExchange.dblp(p_low, p_high, eta=DEFAULT_ETA, freq=DEFAULT_FREQ, seed=seed,
                                          compensation=Compensation.from_label(mode), loss=lossf)
    with tempfile.TemporaryDirectory(prefix="dblp-modes-") as tmp:
        cfg = TrainConfig.for_workload(wl, epochs=epochs, seed=seed, sim_workers=workers, device="cpu",
                                       max_iters_per_epoch=iters_per_epoch, eval_every=eval_every, threads=1,
                                       out_dir=tmp)
        s = train(wl, ex, cfg)
        rows = [json.loads(line) for line in open(Path(tmp) / "evals.jsonl") if line.strip()]
    evals = [(int(r["iteration"]), float(r[s.metric])) for r in rows if r.get(s.metric) is not None]
    return {"mode": mode, "seed": seed, "metric": s.metric, "final": float(s.final_metric), "evals": evals}


def iterations_to(evals: Sequence[tuple[int, float]], target: float) -> float:
    """The first evaluated iteration at or above ``target`` (inf: never)."""
    return next((float(k) for k, v in evals if v >= target), math.inf)


def table(runs: Sequence[dict[str, Any]], targets: Sequence[float]) -> list[list[object]]:
    """One line per mode: iterations to each target and the final metric, median [min-max] over seeds."""
    head: list[object] = ["mode", "seeds"] + [f"iters to {t:g}" for t in targets] + ["final"]
    rows: list[list[object]] = [head]
    for mode in dict.fromkeys(r["mode"] for r in runs):
        rs = [r for r in runs if r["mode"] == mode]
        to_targets = [median_range([iterations_to(r["evals"], t) for r in rs], ".0f") for t in targets]
        rows.append([mode, len(rs)] + to_targets + [median_range([r["final"] for r in rs], ".4f")])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from dblp.results.analysis import format_table
    from traces.argtypes import count_arg, float_arg, int_list_arg

    ap = argparse.ArgumentParser(prog="python -m dblp.train.modes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="digits_mlp", help="the workload (dblp.train.models.WORKLOADS)")
    ap.add_argument("--modes", default="reliable,baseline,paper,unbiased+fill-local,stop-once",
                    help="comma-separated: reliable, baseline (fixed P_low), or DBLP compensation labels "
                         "(dblp.protocol.compensation: paper, unbiased, fill-local, ef-upload, ef-broadcast, ef-both, "
                         "stop-once, '+'-joined)")
    ap.add_argument("--seeds", type=count_arg(1), default=3, help="seeds 0..N-1 of every mode")
    ap.add_argument("--epochs", type=count_arg(1), default=11, help="training epochs")
    ap.add_argument("--iters-per-epoch", type=count_arg(1), default=14,
                    help="iterations per epoch (digits_mlp's emulation default: 14)")
    ap.add_argument("--workers", type=count_arg(1), default=3, help="simulated workers")
    ap.add_argument("--p-low", type=float_arg(0.0, 1.0, hi_open=True), default=DEFAULT_P_LOW,
                    help="the baseline's p and DBLP's P_low (fraction)")
    ap.add_argument("--p-high", type=float_arg(0.0, 1.0, hi_open=True), default=None,
                    help="DBLP's P_high (fraction; default P_low + the policy's K)")
    ap.add_argument("--bursts", type=int_list_arg(0, nonempty=False), default=[50, 110],
                    help="iterations a burst hits (comma-separated; empty: none)")
    ap.add_argument("--burst-loss", type=float_arg(0.0, 1.0), default=0.7,
                    help="fraction of every transfer lost in a burst iteration")
    ap.add_argument("--eval-every", type=count_arg(1), default=3, help="test every N iterations")
    ap.add_argument("--target-accuracy", default=None, help="targets, comma-separated fractions (default 0.9,0.94)")
    a = ap.parse_args(argv)
    try:
        targets = parse_targets(a.target_accuracy, "accuracy")
        modes = [m.strip() for m in a.modes.split(",") if m.strip()]
        for m in modes:
            if m not in (RELIABLE, BASELINE):
                Compensation.from_label(m)
    except (ValueError, ParameterError) as exc:
        ap.error(str(exc))
    p_high = a.p_high if a.p_high is not None else default_p_high(a.p_low)
    runs = []
    total = len(modes) * a.seeds
    for seed in range(a.seeds):  # interleaved, as the emulation's replicates
        for m in modes:
            runs.append(run_mode(a.workload, m, seed, epochs=a.epochs, iters_per_epoch=a.iters_per_epoch,
                                 workers=a.workers, p_low=a.p_low, p_high=p_high, bursts=a.bursts,
                                 loss=a.burst_loss, eval_every=a.eval_every))
            print(f"[{len(runs)}/{total}] seed {seed} {m}: final {runs[-1]['final']:.4f}", file=sys.stderr, flush=True)
    print(f"{a.workload}, {a.workers} simulated workers, P_low {a.p_low:g}, P_high {p_high:g}, "
          f"{a.burst_loss:.0%} loss at {a.bursts}; iterations to each target, median [min-max] over {a.seeds} seeds")
    print(format_table(table(runs, targets)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
