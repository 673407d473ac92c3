"""Microbursts against DBLP and its baselines in Mininet (paper section V-B, Table II).

    sudo python scenarios/microburst.py            # defaults: a few minutes on 2 cores

The real DBLP server and three real workers run as processes in Mininet
hosts on a star of TBF-shaped links (Linux bridges, no controller). A burst
of 70% loss on the server's link, UDP only (the control channel stays
reliable), hits chosen iterations. The same schedule is run for:

* ``reliable``: p = 0, what a fully reliable transport pays;
* ``baseline``: fixed p = P_low (MLT's bounded loss, paper Table I);
* ``dblp``: P_low in the critical learning regime, P_high outside it.

It prints the paper's Table II for this run (latency at each burst, tail,
p99, average, DBLP's speedup over the baseline), the retransmission passes
each side needed at each burst next to the tolerance arithmetic, and writes
rounds.jsonl/CSV, a latency-per-iteration plot and a CDF as PNG into
``results/microburst-<time>/``.
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv)

import argparse
import csv
import json
import os
import sys
import threading
import time
from pathlib import Path

from dblp import analysis
from dblp.gradients import model_elements
from dblp.cli import policy_flags
from dblp.policy import DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_K, DEFAULT_P_LOW
from dblp.wire import ChunkLayout

PORT = 29500


def add_run_args(ap: argparse.ArgumentParser, *, iterations: int, policies: str) -> None:
    """Flags every emulation scenario shares: gradient size, runs, tolerances, links, processes."""
    ap.add_argument("--model", default="1e6",
                    help="gradient size: efficientnetb0 (5M), resnet50 (25M), alexnet (61M), gpt2s (125M) or a count")
    ap.add_argument("--iterations", type=int, default=iterations)
    ap.add_argument("--policies", default=policies, help="runs to make, in order (reliable, baseline, dblp)")
    ap.add_argument("--p-low", type=float, default=DEFAULT_P_LOW, help="baseline p and DBLP's P_low")
    ap.add_argument("--p-high", type=float, default=None, help=f"DBLP's P_high (default P_low + {DEFAULT_K})")
    ap.add_argument("--eta", type=float, default=DEFAULT_ETA)
    ap.add_argument("--freq", type=int, default=DEFAULT_FREQ)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--bw", type=float, default=500.0, help="link bandwidth, Mbit/s (TBF)")
    ap.add_argument("--buffer", type=int, default=100, help="link buffer, packets (TBF limit)")
    ap.add_argument("--pace", type=float, default=0.9,
                    help="senders pace at this fraction of their share of the server link (0 = unpaced)")
    ap.add_argument("--compute-ms", type=float, default=5.0, help="per-iteration compute time of the workers")
    ap.add_argument("--gso", action="store_true",
                    help="use UDP GSO/GRO (default off in emulation: a drop rule would drop 44-datagram super-packets)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default=str(_bootstrap.ROOT / "results"), help="parent folder of the run folder")
    ap.add_argument("--quiet", action="store_true", help="no per-iteration progress")


def check_run_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Validate :func:`add_run_args`'s flags (errors name the flag) and derive the rest."""
    a.policy_list = [x.strip() for x in a.policies.split(",") if x.strip()]
    for p in a.policy_list:
        if p not in ("reliable", "baseline", "dblp"):
            ap.error(f"--policies: unknown policy {p!r} (reliable, baseline, dblp)")
    if not a.policy_list:
        ap.error("--policies: nothing to run")
    if a.iterations < 2:
        ap.error("--iterations must be at least 2")
    if a.bw <= 0 or a.buffer <= 0 or a.workers < 1:
        ap.error("--bw, --buffer and --workers must be positive")
    try:
        a.elements = model_elements(a.model)
    except ValueError as exc:
        ap.error(str(exc))
    if a.p_high is None:
        a.p_high = a.p_low + DEFAULT_K


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Microburst experiment (paper V-B): reliable vs baseline (fixed p) vs DBLP in Mininet.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_run_args(ap, iterations=150, policies="reliable,baseline,dblp")
    ap.add_argument("--bursts", default="50,110", help="iterations hit by a burst (comma list)")
    ap.add_argument("--burst-loss", type=float, default=0.7, help="loss fraction during a burst")
    ap.add_argument("--burst-kind", choices=["drop", "congestion"], default="drop",
                    help="drop: nftables random drop of UDP; congestion: iperf3 UDP cross-traffic into the bottleneck")
    a = ap.parse_args(argv)
    check_run_args(ap, a)
    a.bursts_list = [int(x) for x in a.bursts.split(",") if x.strip()]
    if any(not 0 <= b < a.iterations for b in a.bursts_list):
        ap.error(f"--bursts must lie in [0, {a.iterations})")
    if not 0 <= a.burst_loss <= 1:
        ap.error(f"--burst-loss must be in [0, 1], got {a.burst_loss}")
    return a


def policy_args(name: str, a: argparse.Namespace) -> list[str]:
    return policy_flags(name, a.p_low, a.p_high, a.eta, a.freq)


class RoundWatcher(threading.Thread):
    """Tells the burst injector when an iteration starts: iteration k starts
    once the server has written the records of round k-1 for every worker."""

    def __init__(self, path: Path, workers: int, injector, progress) -> None:
        super().__init__(daemon=True)
        self.path, self.workers, self.injector, self.progress = path, workers, injector, progress
        self.done = threading.Event()
        self.rounds = 0

    def run(self) -> None:
        seen = 0
        while not self.done.is_set():
            try:
                with open(self.path, "rb") as fh:
                    lines = fh.read().count(b"\n")
            except FileNotFoundError:
                lines = 0
            rounds = lines // self.workers
            if rounds != seen:
                seen = rounds
                self.rounds = rounds
                self.injector.on_iteration(rounds)
                self.progress(rounds)
            time.sleep(0.001)


def run_policy(name: str, a: argparse.Namespace, net, lc, out: Path, schedule) -> Path:
    from emulation.bursts import BurstInjector
    from emulation.loss import LossTarget

    py = str(_bootstrap.VENV_PY if _bootstrap.VENV_PY.exists() else sys.executable)
    d = out / name
    (d / "records").mkdir(parents=True, exist_ok=True)
    share = a.bw * 1e6 / a.workers
    rate = str(a.pace * share) if a.pace > 0 else "0"
    plain = [] if a.gso else ["--plain"]
    env = {"PYTHONPATH": str(_bootstrap.ROOT), "PYTHONUNBUFFERED": "1"}
    targets = [LossTarget("srv", "ingress", "udp"), LossTarget("srv", "egress", "udp")]
    log = open(d / "processes.log", "w")
    with BurstInjector(lc, schedule, targets, log_path=d / "bursts.jsonl") as inj:
        inj.on_iteration(0)
        srv = net.popen("srv", [py, "-m", "dblp", "server", "--port", str(PORT), "--workers", str(a.workers),
                                "--rounds", str(a.iterations), "--records", str(d / "records" / "server.jsonl"),
                                "--source", "emulation", "--rate", rate, "--seed", str(a.seed),
                                "--peer-timeout", "60", *plain, *policy_args(name, a)],
                        env=env, stdout=log, stderr=log)
        time.sleep(1.0)
        ip = net.ip("srv")
        workers = [
            net.popen(f"w{i + 1}", [py, "-m", "dblp", "worker", "--server", f"{ip}:{PORT}", "--id", str(i),
                                    "--model", str(a.elements), "--rounds", str(a.iterations), "--seed", str(a.seed),
                                    "--records", str(d / "records" / f"worker{i}.jsonl"), "--source", "emulation",
                                    "--rate", rate, "--compute-ms", str(a.compute_ms), "--peer-timeout", "60",
                                    *plain],
                      env=env, stdout=log, stderr=log)
            for i in range(a.workers)
        ]
        t0 = time.time()

        def progress(r: int) -> None:
            if not a.quiet and (r % 10 == 0 or r in a.bursts_list or r - 1 in a.bursts_list or r == a.iterations):
                rate_s = r / max(1e-9, time.time() - t0)
                print(f"  {name:9s} iteration {r:5d}/{a.iterations}  ({rate_s:.1f} it/s)", flush=True)

        watcher = RoundWatcher(d / "records" / "server.jsonl", a.workers, inj, progress)
        watcher.start()
        try:
            deadline = time.time() + 60 + a.iterations * 30
            for p in workers + [srv]:
                p.wait(timeout=max(1, deadline - time.time()))
        finally:
            watcher.done.set()
            watcher.join()
            for p in workers + [srv]:
                if p.poll() is None:
                    p.kill()
            log.close()
    bad = [p for p in workers + [srv] if p.returncode != 0]
    if bad:
        raise RuntimeError(f"{name}: a process failed; see {d / 'processes.log'}:\n"
                           + (d / "processes.log").read_text()[-3000:])
    return d


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("microburst.py needs root for Mininet: run it as `sudo python scenarios/microburst.py`", file=sys.stderr)
        return 2
    from emulation.bursts import CongestionBurst, IterationBurst
    from emulation.loss import LossController
    from emulation.net import EmuNet
    from emulation.recorder import RunRecorder
    from topologies.star import StarTopo

    config = {k: v for k, v in vars(a).items()}
    rec = RunRecorder("microburst", config, root=a.results)
    out = rec.path
    lay = ChunkLayout(a.elements)
    print(f"microburst: {a.elements:,} float32 gradient ({lay.chunks:,} datagrams/worker/direction), "
          f"{a.workers} workers, {a.bw:g} Mbit/s links, {a.buffer}-packet buffers, {a.iterations} iterations, "
          f"{a.burst_loss:.0%} bursts at {a.bursts_list}\n  results: {out}", flush=True)
    if a.burst_kind == "drop":
        schedule = [IterationBurst(b, a.burst_loss, 1) for b in a.bursts_list]
    else:
        schedule = [CongestionBurst(src="x1", dst="srv", rate_mbps=a.bw * 3, duration_s=1.0, at_iteration=b)
                    for b in a.bursts_list]
    cross = 1 if a.burst_kind == "congestion" else 0  # x1 sends the cross-traffic, on a 10x faster link
    topo = StarTopo(n=a.workers, bw=a.bw, buffer_pkts=a.buffer, cross_hosts=cross, cross_bw=10 * a.bw)
    runs: dict[str, list] = {}
    with EmuNet(topo, name="microburst") as net, LossController(net) as lc:
        rec.snapshot("start", net=net, loss=lc)
        for name in a.policy_list:
            t = time.time()
            print(f"- {name}: {' '.join(policy_args(name, a))}", flush=True)
            d = run_policy(name, a, net, lc, out, schedule)
            runs[name] = analysis.load(d / "records")
            print(f"  {name} done in {time.time() - t:.0f} s", flush=True)
        rec.finish(net=net, loss=lc)
    merge_runs(runs, out / "rounds.jsonl")
    report(a, runs, out)
    return 0


def merge_runs(runs: dict[str, list], path: Path) -> None:
    """All runs' records in one file, each tagged with its run in ``extra["run"]``."""
    from dblp.records import write_records

    path.unlink(missing_ok=True)
    tagged = []
    for name, recs in runs.items():
        for r in recs:
            r.extra = {**r.extra, "run": name}
            tagged.append(r)
    write_records(path, sorted(tagged, key=lambda r: (r.extra["run"], r.round, r.role, r.worker)))


def report(a: argparse.Namespace, runs: dict[str, list], out: Path) -> None:
    bursts = a.bursts_list
    sums = {k: analysis.summarize(v, bursts) for k, v in runs.items()}
    print()
    if "baseline" in sums and "dblp" in sums:
        rows = analysis.table_ii(sums["baseline"], sums["dblp"], bursts)
        print("Table II (this run): send latency, slowest worker, seconds")
        print(analysis.format_table(rows))
        with open(out / "table_ii.csv", "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
    print("\nAll runs:")
    hdr = ["run", "p50", "p99", "max", "mean"] + [f"@{b}" for b in bursts] + ["min recv frac"]
    rows = [hdr] + [[k, f"{s.p50:.4f}", f"{s.p99:.4f}", f"{s.tail_max:.4f}", f"{s.mean:.4f}"]
                    + [f"{x:.4f}" for x in s.at_bursts] + [f"{s.recv_frac_min:.3f}"] for k, s in sums.items()]
    print(analysis.format_table(rows))
    congestion = a.burst_kind == "congestion"
    how = ("congestion: loss from the full bottleneck queue, no fixed rate to predict from" if congestion
           else f"{a.burst_loss:.0%} loss; predicted from 1 - loss^k >= 1 - p")
    print(f"\nRetransmission passes at the bursts ({how}):")
    prow = [["run", "tolerance"] + [f"@{b} measured" for b in bursts] + ["predicted"]]
    for k, recs in runs.items():
        tol = {r.round: r.tolerance_up for r in recs if r.role == "worker"}
        for_b = [tol.get(b, float("nan")) for b in bursts]
        chunks = next((r.chunks for r in recs if r.chunks), None)
        pred = ["-" if congestion else analysis.predicted_passes(a.burst_loss, t, chunks) for t in for_b]
        prow.append([k, "/".join(f"{t:.3f}" for t in for_b)] + [str(x) for x in sums[k].passes_at_bursts]
                    + ["/".join(map(str, pred))])
    print(analysis.format_table(prow))
    with open(out / "summary.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    (out / "summary_runs.json").write_text(json.dumps({k: s.as_dict() for k, s in sums.items()}, indent=1))
    analysis.plot_latency(runs, out / "latency.png", bursts, "Send latency per iteration under microbursts")
    analysis.plot_cdf(runs, out / "cdf.png")
    print(f"\nwrote {out}/table_ii.csv, summary.csv, rounds.jsonl, latency.png, cdf.png")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # EmuNet has already removed every namespace, link, qdisc and nft table of the run.
        print("\nmicroburst.py: interrupted; the emulated network was torn down "
              "(partial results stay in the run folder)", file=sys.stderr)
        sys.exit(130)
