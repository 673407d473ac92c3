"""Real training over the real DBLP transport: baseline vs DBLP (paper Tables V and VI).

    python scenarios/train.py                       # small CNN on the bundled digits, 3 workers, CPU

A DBLP server and N training workers (``python -m dblp.train worker``) run as
separate processes on loopback with the same seed and epochs, once per
policy: ``baseline`` (fixed p = P_low, MLT) and ``dblp`` (P_low in the
critical regime, P_high = P_low + 0.4 elsewhere), optionally ``reliable``
(p = 0). ``--loss`` drops that fraction of every UDP datagram inside a
network namespace (nftables, root only), so the tolerances really bite.
Prints the final test metric (Table VI) and the training time normalised to
DBLP (Table V) with what explains it - the share of DBLP's rounds in the
critical regime (run at P_low, the baseline's p, so no faster), exchange and
compute time per round (the same work: a compute difference is the machine's
load) - and writes accuracy and time curves as PNG plus CSV/JSON.

Time to accuracy (docs/time-to-accuracy.md): the workers test every
``--eval-every`` iterations (``evals.jsonl``); Table V gives, beside the time to
the last iteration, the time and iteration at which each run first reaches each
``--target-accuracy`` (normalised to DBLP, "not reached" stated), through
:func:`dblp.results.trainreport.report`, the emulation scenarios' report. ``--seeds N``
runs every policy N times, interleaved (seed s of every policy back to back),
into ``seed<s>/``, and prints every Table IV/V figure as a median with its 95%
interval and whether DBLP's difference to the baseline exceeds the spread;
``curves.csv`` holds every run's curve for the simulator's convergence model.
"""

from __future__ import annotations

import _bootstrap  # noqa: F401

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

from dblp.results.analysis import RUN_COLORS
from dblp.cli.args import (add_compensation_args, add_seeds_arg, add_target_args, check_compensation_args,
                          check_policy_args, parse_targets, parser, tolerance_arg)
from dblp.protocol.compensation import Compensation
from dblp.runs.launch import Launch, LaunchError, LocalRunner, RunArgs, train_worker_argv
from dblp.cli.provenance import write_config
from dblp.results.trainreport import replicate_dir
from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_K, DEFAULT_P_LOW, RUNS, default_p_high, parse_runs
from traces.argtypes import count_arg, float_arg, int_arg
from dblp.protocol.policy import run_policy as named_policy
from dblp.transport.watch import Tail
from dblp.protocol.wire import ParameterError

PY = str(_bootstrap.VENV_PY if _bootstrap.VENV_PY.exists() else sys.executable)


def build_parser() -> argparse.ArgumentParser:
    ap = parser(description="Train a model over DBLP: baseline vs DBLP, accuracy and time.")
    ap.add_argument("--workload", default="small_cnn",
                    help="small_cnn (digits, bundled) | small_transformer (bundled text) | efficientnet_b0 | "
                         "resnet50 | alexnet (CIFAR, --data-root) | gpt2_s (WikiText-2, --data-root)")
    ap.add_argument("--data-root", default=None, help="folder of the data set (paper workloads; default: $DBLP_DATA_ROOT)")
    ap.add_argument("--workers", type=count_arg(1), default=3, help="number of workers")
    ap.add_argument("--epochs", type=count_arg(1), default=20, help="training epochs of each run")
    ap.add_argument("--policies", default="baseline,dblp", help=f"runs to make, in order ({', '.join(RUNS)})")
    ap.add_argument("--p-low", type=tolerance_arg, default=DEFAULT_P_LOW, help="baseline p and DBLP's P_low")
    ap.add_argument("--p-high", type=tolerance_arg, default=None, help=f"DBLP's P_high (default P_low + {DEFAULT_K})")
    ap.add_argument("--eta", type=float_arg(0.0), default=DEFAULT_ETA, help="CLR detection threshold")
    ap.add_argument("--freq", type=count_arg(1), default=DEFAULT_FREQ, help="CLR check period in iterations")
    ap.add_argument("--loss", type=float_arg(0.0, 1.0, hi_open=True), default=0.0,
                    help="random UDP loss probability inside a network namespace (root; 0 = plain loopback)")
    ap.add_argument("--seed", type=int_arg(0), default=0, help="random seed of every process")
    add_compensation_args(ap)
    ap.add_argument("--max-iters-per-epoch", type=count_arg(1), default=None,
                    help="cap on iterations per epoch (default: all)")
    add_target_args(ap)
    add_seeds_arg(ap)
    ap.add_argument("--results", default=str(_bootstrap.ROOT / "results"), help="parent folder of the run folder")
    ap.add_argument("--out", default=None,
                    help="folder of this run's files (default: a new timestamped folder under --results)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        a.policy_list = parse_runs(a.policies)
    except ParameterError as exc:
        ap.error(f"--policies: {exc}")
    if a.loss and os.geteuid() != 0:
        ap.error("--loss needs root (an nftables rule in a network namespace)")
    check_policy_args(ap, a, a.policy_list)  # the policy objects' own checks, before any process starts
    check_compensation_args(ap, a)
    if a.p_high is None:
        a.p_high = default_p_high(a.p_low)
    from dblp.runs.gradients import model_name
    from dblp.train.models import WORKLOADS

    if model_name(a.workload) not in WORKLOADS:
        ap.error(f"argument --workload: unknown workload {a.workload!r}; known: {', '.join(WORKLOADS)}")
    if a.data_root and not os.path.isdir(a.data_root):
        ap.error(f"argument --data-root: {a.data_root!r} is not a folder")
    from dblp.train.models import WORKLOAD_DEFAULTS, train_samples, workload_key, workload_metric

    a.metric = workload_metric(a.workload)
    try:
        a.targets = parse_targets(a.target_accuracy, a.metric)
    except ValueError as exc:
        ap.error(f"argument --target-accuracy: {exc} (--workload {a.workload} reports {a.metric})")
    if a.eval_every == "auto":  # a quarter of a worker's epoch; the epoch ends where its length is unknown
        n = train_samples(a.workload)
        per_epoch = n // a.workers // int(WORKLOAD_DEFAULTS[workload_key(a.workload)].get("batch_size", 32)) \
            if n else 0
        if a.max_iters_per_epoch:
            per_epoch = min(per_epoch, a.max_iters_per_epoch) if per_epoch else a.max_iters_per_epoch
        a.eval_every = max(1, per_epoch // 4) if per_epoch else 0
    return a


def policy_args(name: str, a: argparse.Namespace) -> list[str]:
    return named_policy(name, a.p_low, a.p_high, a.eta, a.freq).flags()


def run_policy(name: str, a: argparse.Namespace, out: Path, prefix: list[str]) -> dict:
    """One policy: the server and the training workers through the one launcher (dblp.runs.launch)."""
    d = out / name
    train = {"workload": a.workload, "epochs": a.epochs, "iterations_per_epoch": a.max_iters_per_epoch,
             "data_root": a.data_root, "eval_every": a.eval_every}

    def train_worker(i: int, server: str, records: Path) -> list[str]:
        return train_worker_argv(args, {**train, "progress": i == 0 and not a.quiet}, i, server, records, d / f"w{i}")

    args = RunArgs(workers=a.workers, iterations=None, model=0, policy=policy_args(name, a), source="loopback",
                   seed=a.seed, peer_timeout_s=120, plain=False, port=0, python=PY,
                   server_extra=Compensation.from_args(a).flags())
    env = {"PYTHONPATH": str(_bootstrap.ROOT), "OMP_NUM_THREADS": "1"}
    progress = Tail(d / "worker0.log")
    t0 = time.time()
    try:
        with Launch(LocalRunner(prefix), "local", ["local"] * a.workers, args, records_dir=d, log_dir=d, env=env,
                    bind="127.0.0.1", worker_program=train_worker) as run:
            run.wait(3600, on_poll=lambda: [print("  " + ln.decode(errors="replace"), flush=True)
                                            for ln in progress.lines() if not ln.startswith(b"{")])
    except LaunchError as exc:
        raise SystemExit(f"train: {name}: {exc}") from None
    wall = time.time() - t0
    summaries = [json.loads((d / f"w{i}" / "summary.json").read_text()) for i in range(a.workers)]
    epochs = [json.loads(line) for line in open(d / "w0" / "epochs.jsonl")]
    return {"name": name, "wall_s": wall, "summaries": summaries, "epochs": epochs}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out = Path(a.out) if a.out else Path(a.results) / f"train-{time.strftime('%Y%m%d-%H%M%S')}"
    if (out / "config.json").exists():
        print(f"train.py: error: argument --out: {out} already holds a run (config.json); name another folder",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, a)  # the resolved flags, commit and package versions (--config takes it back)
    print(f"train: {a.workload}, {a.workers} workers, {a.epochs} epochs, policies {a.policy_list}, "
          f"loss {a.loss:.1%}\n  results: {out}", flush=True)
    by_seed: dict[int, dict] = {}
    from emulation.lossyns import LossyLoopback

    seeds = list(range(a.seed, a.seed + a.seeds))
    ns = LossyLoopback(a.loss) if a.loss else None
    try:
        prefix = ns.__enter__().prefix() if ns else []
        k = 0
        for seed in seeds:  # interleaved: seed s of every policy back to back, so machine drift hits all alike
            sa = argparse.Namespace(**{**vars(a), "seed": seed})
            d = replicate_dir(out, seed, len(seeds))
            for name in a.policy_list:
                k += 1
                at = f"[{k}/{len(seeds) * len(a.policy_list)}] seed {seed}: " if len(seeds) > 1 else ""
                print(f"- {at}{name}: {' '.join(policy_args(name, a))}", flush=True)
                r = by_seed.setdefault(seed, {})[name] = run_policy(name, sa, d, prefix)
                s0 = r["summaries"][0]
                print(f"  {name}: final {s0['metric']} {s0['final_metric']:.4f}, {s0['wall_s']:.0f} s of training",
                      flush=True)
    finally:
        if ns:
            ns.__exit__()
    report(a, by_seed[seeds[0]], replicate_dir(out, seeds[0], len(seeds)), first_of=len(seeds))
    from dblp.results.trainreport import report as training_report

    training_report(out, a.policy_list, a.workers, f"{a.workload}, {a.workers} workers, loopback",
                    f"{a.loss:.1%} UDP loss" if a.loss else "no loss", divergence=False, targets=a.targets,
                    seeds=seeds)
    return 0


def regime(d: Path) -> dict:
    """The server's rounds of one run: how many, how many in the critical regime, the mean tolerance."""
    from dblp.protocol.records import read_records

    rounds = {r.round: r for r in read_records(d / "server.jsonl") if r.role == "server"}
    n = max(len(rounds), 1)
    return {"rounds": len(rounds), "clr_rounds": sum(bool(r.clr) for r in rounds.values()),
            "clr_fraction": sum(bool(r.clr) for r in rounds.values()) / n,
            "tolerance_mean": sum(r.tolerance_up for r in rounds.values()) / n,
            "policy": next(iter(rounds.values())).policy if rounds else ""}


def report(a: argparse.Namespace, runs: dict, out: Path, first_of: int = 1) -> None:
    """What explains the training times of one seed's runs (CLR share, exchange and compute per round),
    written into ``out``; Tables IV/V with the targets and the seeds: :func:`dblp.results.trainreport.report`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = next(iter(runs.values()))["summaries"][0]["metric"]
    # Training time: the slowest worker's training loop (process start-up, imports and evaluation excluded).
    for name, r in runs.items():
        r["train_s"] = max(s["train_s"] for s in r["summaries"])
        r["regime"] = regime(out / name)
        iters = max(r["summaries"][0]["iterations"], 1)
        r["exchange_ms"] = 1e3 * r["summaries"][0]["exchange_s"] / iters
        r["compute_ms"] = 1e3 * (r["summaries"][0]["train_s"] - r["summaries"][0]["exchange_s"]) / iters
    rows = [["run", f"final {metric} (worker 0)", f"final {metric} (mean of workers)", "train time (s)",
             "exchange time (s)", "rounds", "rounds in CLR", "mean tolerance", "exchange/round (ms)",
             "compute/round (ms)", "time / dblp"]]
    ref = runs.get("dblp", next(iter(runs.values())))["train_s"]
    for name, r in runs.items():
        finals = [s["final_metric"] for s in r["summaries"]]
        g = r["regime"]
        in_clr = f"{g['clr_fraction']:.1%}" if g["policy"] == "dblp" else "- (fixed p)"
        rows.append([name, f"{finals[0]:.4f}", f"{sum(finals) / len(finals):.4f}", f"{r['train_s']:.1f}",
                     f"{r['summaries'][0]['exchange_s']:.1f}", str(g["rounds"]), in_clr, f"{g['tolerance_mean']:.3f}",
                     f"{r['exchange_ms']:.1f}", f"{r['compute_ms']:.1f}", f"{r['train_s'] / ref:.2f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    which = "this run" if first_of == 1 else f"the first of {first_of} seeds"
    print(f"\nWhat explains the training time ({which}): final test metric, time and its parts per round")
    for j, row in enumerate(rows):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    print("\ntime / dblp: each run's training time (the slowest worker's training loop; start-up and "
          "evaluation excluded) over DBLP's.")
    if "dblp" in runs:
        g = runs["dblp"]["regime"]
        print(f"DBLP ran {g['clr_rounds']} of its {g['rounds']} rounds ({g['clr_fraction']:.1%}) in the critical "
              f"regime at P_low = {a.p_low:g}, the baseline's own p: only the other "
              f"{g['rounds'] - g['clr_rounds']} rounds, at P_high = {a.p_high:g}, can be faster.")
        if not a.loss:
            print("Without --loss every datagram arrives on loopback, so a tolerance only lets a receiver stop "
                  "before the last few chunks of a round; the round's time is mostly per-round overhead "
                  "(control messages, the wait for the slowest worker), the same under both policies.")
    if len(runs) > 1:
        cms = [r["compute_ms"] for r in runs.values()]
        spread = max(cms) / max(min(cms), 1e-9) - 1
        if spread > 0.05:
            print(f"Compute per round differs by {spread:.0%} between runs although the work is identical: the "
                  "machine's load changed between runs, and time ratios within that margin are noise.")
    if "baseline" in runs and "dblp" in runs:
        b = runs["baseline"]["summaries"][0]["final_metric"]
        d = runs["dblp"]["summaries"][0]["final_metric"]
        print(f"\nDBLP reaches {d / b:.2%} of the baseline's final {metric}; "
              f"training time baseline/DBLP = {runs['baseline']['train_s'] / runs['dblp']['train_s']:.2f}x")
    with open(out / "summary.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    (out / "summary.json").write_text(json.dumps({k: {"wall_s": v["wall_s"], "train_s": v["train_s"],
                                                      "regime": v["regime"], "exchange_ms": v["exchange_ms"],
                                                      "compute_ms": v["compute_ms"], "summaries": v["summaries"]}
                                                  for k, v in runs.items()}, indent=1))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in runs.items():
        ep = [e for e in r["epochs"] if e.get("epoch", 0) >= 1]
        ax1.plot([e["epoch"] for e in ep], [e[metric] for e in ep], marker="o", label=name, color=RUN_COLORS.get(name))
        ax2.plot([e["elapsed_s"] for e in ep], [e[metric] for e in ep], marker="o", label=name,
                 color=RUN_COLORS.get(name))  # seconds since the worker's training began
    from matplotlib.ticker import MaxNLocator

    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_xlabel("epoch"); ax1.set_ylabel(f"test {metric}"); ax1.grid(alpha=0.3); ax1.legend()
    ax2.set_xlabel("wall time since the start of training (s)"); ax2.set_ylabel(f"test {metric}"); ax2.grid(alpha=0.3); ax2.legend()
    fig.suptitle(f"{a.workload} over DBLP, {a.workers} workers")
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out}/summary.csv, summary.json, curves.png")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ntrain.py: interrupted; what the run made was removed (partial results stay in the run folder)",
              file=sys.stderr)
        sys.exit(130)
