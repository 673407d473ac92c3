"""A loss trace replayed against DBLP and its baselines in Mininet.

    sudo python scenarios/trace_replay.py                        # a sample trace, a few minutes
    sudo python scenarios/trace_replay.py --trace my.loss.csv    # your own (traces/FORMAT.md)

The real DBLP server and workers run as processes in Mininet hosts on a star
of TBF-shaped links, as in ``scenarios/microburst.py``; instead of scripted
bursts, a loss trace file is replayed on the server's link (UDP only, so the
control channel stays reliable; both directions by default) by
``emulation.replay.TraceReplayer``:

* a **segments** trace (``*.loss.csv``, time-varying loss) is followed by
  kernel drop-rule swaps on the trace's schedule, at most one per
  ``--min-step`` (shorter segments averaged, mean loss kept), the trace's
  clock starting when the server is launched;
* a **packets** trace (``*.pkts``) is applied exactly, packet by packet, in the
  kernel (the k-th UDP datagram through each direction gets verdict k).

The trace loops by default (``--once`` plays it once, loss 0 afterwards), so a
run of any length sees it. The same trace is replayed from its start for each
policy:

* ``baseline``: fixed p = P_low (MLT's bounded loss);
* ``dblp``: P_low in the critical learning regime, P_high outside it;
* ``reliable`` (add it with ``--policies reliable,baseline,dblp``): p = 0.

Printed and written to ``results/trace_replay-<time>/``: per-iteration send
latency (slowest worker) and its tail (max, p99), average, the received
fractions, DBLP's speedup over the baseline, and the loss actually replayed
(the trace's mean over the run vs the achieved schedule vs the kernel's
drop counters vs, for a reliable run, the datagrams the records show lost);
``latency.png``, ``cdf.png``, ``loss.png`` (loss each iteration saw, next to
its latency: the replayed schedule's mean for a segments trace, the loss the
records measured for a packets trace), ``summary.csv``, ``rounds.csv``, and
per policy the replay log ``<policy>/replay.jsonl`` (every rule change, due
and actual time) and, for a segments trace, the achieved schedule as a trace
file ``<policy>/achieved.loss.csv`` (a packets trace is applied exactly: what
was applied is the trace itself).

``--seeds N`` runs every policy N times, interleaved (seed s of every policy
back to back, :func:`emulation.launch.run_replicates`, the trace replayed from
its start for each run), into ``seed<s>/``: the latency figures are printed as
medians with 95% intervals over the seeds with the DBLP-baseline verdict (the
per-run tables and plots are the first seed's), and with a training workload
Tables IV/V (time to each ``--target-accuracy``) too, their plots drawing every
seed (:func:`dblp.results.trainreport.report`).
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (re-exec into the project's .venv)

import argparse
import contextlib
import csv
import json
import math
import os
import sys
from pathlib import Path

from dblp.results import analysis
from dblp.results.exposure import exposure_by_direction, exposure_by_round, received_fractions, run_window
from dblp.protocol.wire import TAG_SIZE, ChunkLayout
from dblp.cli.args import (add_compensation_args, add_configs_arg, add_run_args, add_seeds_arg, add_workload_args,
                          check_compensation_args, check_configs_arg, check_scenario_args, parser)
from dblp.protocol.policy import run_policy as named_policy
from dblp.cli.provenance import config_record
from traces.argtypes import float_arg
from traces.units import duration_arg

DEFAULT_TRACE = _bootstrap.ROOT / "traces" / "samples" / "onoff-lognormal.loss.csv"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser(description="Replay a loss trace on the server's link in Mininet: baseline (fixed p) vs DBLP "
                            "(and optionally reliable).")
    ap.add_argument("--trace", default=str(DEFAULT_TRACE),
                    help="trace file (traces/FORMAT.md): *.loss.csv (segments) or *.pkts (per packet)")
    ap.add_argument("--direction", choices=["both", "up", "down"], default="both",
                    help="where the trace applies: up = workers->server (server ingress), "
                         "down = server->workers (server egress), both = each direction gets the trace")
    ap.add_argument("--once", action="store_true",
                    help="play the trace once (no loss after its end) instead of looping it")
    ap.add_argument("--time-scale", type=float_arg(0.0, lo_open=True), default=1.0,
                    help="wall seconds per trace second (segments; 2 = play twice as slowly)")
    ap.add_argument("--min-step", type=duration_arg(allow_zero=False), default=None,
                    help="shortest interval between two rule swaps, e.g. 1ms (segments; default 1ms with "
                         "libnftables, 20ms with the nft command)")
    ap.add_argument("--backend", choices=["auto", "libnftables", "nft"], default="auto",
                    help="how rules are swapped (segments)")
    add_run_args(ap, iterations=100, policies="baseline,dblp", results=_bootstrap.ROOT / "results")
    add_workload_args(ap, default=None)
    add_seeds_arg(ap)
    add_compensation_args(ap)
    add_configs_arg(ap)
    a = ap.parse_args(argv)
    check_scenario_args(ap, a)
    check_compensation_args(ap, a)
    check_configs_arg(ap, a)
    from traces import TraceError, read_trace

    try:  # read now: a bad file is refused before Mininet is built
        tr = read_trace(a.trace)
    except (OSError, TraceError, ValueError) as exc:
        ap.error(f"argument --trace: {exc}")
    if not a.once and len(tr) and tr.mean_loss() >= 1.0:
        ap.error(f"argument --trace: {a.trace} drops every packet and loops: no round could ever finish "
                 "(use --once, or a trace with some delivery)")
    a.min_step_us = None if a.min_step is None else max(1, round(a.min_step * 1e6))
    a.bursts_list = []  # run_scenario_policy's progress marks: none here
    return a


def load_trace(path: str):
    from traces import TraceError, read_trace

    try:
        return read_trace(path)
    except FileNotFoundError:
        raise SystemExit(f"trace_replay.py: no trace file {path}")
    except (TraceError, ValueError) as exc:
        raise SystemExit(f"trace_replay.py: {exc}")


def targets_for(direction: str):
    from emulation.loss import LossTarget

    up, down = LossTarget("srv", "ingress", "udp"), LossTarget("srv", "egress", "udp")
    return {"both": [up, down], "up": [up], "down": [down]}[direction]


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("trace_replay.py needs root for Mininet: run it as `sudo python scenarios/trace_replay.py`",
              file=sys.stderr)
        return 2
    trace = load_trace(a.trace)
    from emulation.loss import LossController
    from emulation.net import EmuNet
    from emulation.recorder import RunRecorder
    from emulation.replay import TraceReplayer, datagram_loss
    from dblp.protocol.records import merge_runs
    from emulation.launch import run_replicates
    from topologies.star import StarTopo
    from traces import SegmentTrace, summarize

    config = config_record(a)  # the flags as given (--config reruns the run) and, apart, what it derived
    rec = RunRecorder("trace_replay", config, root=a.results, out=a.out)
    out = rec.path
    lay = ChunkLayout(a.elements, a.mtu, key=None if a.insecure else bytes(TAG_SIZE))  # sizes only: the run's wire
    s = summarize(trace)
    span = f"{s.span / 1e6:g} s" if s.form == "segments" else f"{int(s.span):,} packets"
    print(f"trace_replay: {a.trace}\n  {s.form}, {s.provenance}, {span}, mean loss {s.mean_loss:.4%}, "
          f"{s.bursts} bursts; {'played once' if a.once else 'looped'} on "
          f"{', '.join(t.label() for t in targets_for(a.direction))}", flush=True)
    print(f"  {a.elements:,} float32 gradient ({lay.chunks:,} datagrams/worker/direction), {a.workers} workers, "
          f"{a.bw_mbps:g} Mbit/s links, {a.queue:,}-byte queues, {a.iterations} iterations\n  results: {out}",
          flush=True)
    topo = StarTopo(n=a.workers, bw=a.bw_mbps, buffer_bytes=a.queue)
    seeds = list(range(a.seed, a.seed + a.seeds))
    by_seed: dict[int, dict[str, list]] = {}
    losses: dict[int, dict[str, dict]] = {}
    exposure: dict[int, dict[str, dict[int, float]]] = {}

    @contextlib.contextmanager
    def replaying(name: str, seed: int, d: Path):
        """The trace from its start for this run (run_replicates enters it around each run), then what it played."""
        with TraceReplayer(lc, trace, targets_for(a.direction), log_path=d / "replay.jsonl",
                           time_scale=a.time_scale, min_step_us=a.min_step_us,
                           loop=not a.once, backend=a.backend) as rp:
            if not losses and isinstance(trace, SegmentTrace):
                step = f"resampled to {rp.bin_us} us bins" if rp.bin_us else "at full resolution"
                print(f"  replay: {rp.backend.name} rule swaps, {step}, "
                      f"{len(rp.played)} segments per pass", flush=True)
            yield rp
        recs = analysis.load(d / "records")
        by_seed.setdefault(seed, {})[name] = recs
        w_all = run_window(recs)
        summ = rp.summary(*w_all)
        summ["records"] = datagram_loss(recs)
        summ["while_sending"] = exposure_by_direction(rp.requested_mean, recs)
        summ["window"] = w_all
        if rp.mode == "segments":
            rp.write_achieved(d / "achieved.loss.csv")
            exposure.setdefault(seed, {})[name] = exposure_by_round(rp.achieved_mean, recs)
        losses.setdefault(seed, {})[name] = summ
        (d / "replay_summary.json").write_text(json.dumps(summ, indent=1, default=str))
        print(f"  loss over the run: {loss_line(summ)}", flush=True)

    with EmuNet(topo, name="trace_replay", mtu=a.mtu) as net, LossController(net) as lc:
        if a.gso:  # before the replayer places its rules: on segmented links they sit on the switch ends
            lc.use_segmented_links(net.hosts)
        rec.snapshot("start", net=net, loss=lc)
        for name in a.policy_list:
            print(f"- {name}: {' '.join(named_policy(name, a.p_low, a.p_high, a.eta, a.freq).flags())}", flush=True)
        py = str(_bootstrap.VENV_PY if _bootstrap.VENV_PY.exists() else sys.executable)
        for label, comp in a.config_list:
            print(f"- {label}: {' '.join(named_policy('dblp', a.p_low, a.p_high, a.eta, a.freq).flags())} "
                  f"{' '.join(comp.flags())}", flush=True)
        run_replicates(a, net, lc, out, [], policies=a.policy_list, seeds=seeds, python=py,
                       variants=[(label, comp.to_dict()) for label, comp in a.config_list],
                       env={"PYTHONPATH": str(_bootstrap.ROOT)}, around=replaying)
        rec.finish(net=net, loss=lc, extra={"replay": losses[seeds[0]] if len(seeds) == 1 else
                                            {f"seed{s}": v for s, v in losses.items()}})
    first = seeds[0]
    # the recorder merges <run>/records/, the runs write <run>/<policy>/records/: merge those
    merge_runs(by_seed[first], out / "rounds.jsonl")  # each row labelled with its run in "run" (the first seed's)
    report(a, trace, by_seed[first], losses[first], exposure.get(first, {}), out, by_seed)
    if a.train:  # real training workers: accuracy and training time under the replayed loss
        from dblp.results.trainreport import report as training_report
        from dblp.results.tta import report as answer

        answer(out, a.policy_list + [label for label, _ in a.config_list], a.workers, seeds, [], a.train["targets"],
               condition=f"trace {Path(a.trace).name}",
               setup=f"{a.train['workload']}, {a.workers} workers, trace {Path(a.trace).name}")

        training_report(out, a.policy_list + [label for label, _ in a.config_list], a.workers, f"{a.train['workload']}, {a.workers} workers",
                        f"trace {Path(a.trace).name}", divergence=a.train["save_weights"], targets=a.train["targets"],
                        seeds=seeds)
    return 0


def loss_line(s: dict) -> str:
    parts = [f"trace {s['requested_mean_loss']:.3%}"]
    if "achieved_mean_loss" in s:
        parts.append(f"achieved schedule {s['achieved_mean_loss']:.3%}")
    for label, c in (s.get("kernel") or {}).items():
        if c.get("fraction") is not None:
            parts.append(f"{label.split(':')[1]} dropped {c['dropped']}/{c['seen']} = {c['fraction']:.3%}")
    return ", ".join(parts)


def _fmt(x: float, spec: str = ".4f") -> str:
    return "nan" if x is None or not math.isfinite(x) else format(x, spec)


def report(a: argparse.Namespace, trace, runs: dict[str, list], losses: dict[str, dict],
           exposure: dict[str, dict[int, float]], out: Path, by_seed: dict[int, dict[str, list]] | None = None) -> None:
    """The latency and replayed-loss tables of one seed's ``runs`` (the first), and with several seeds
    in ``by_seed`` the latency figures as medians with 95% intervals and the DBLP-baseline verdict."""
    sums = {k: analysis.summarize(v) for k, v in runs.items()}
    fr = {k: received_fractions(recs) for k, recs in runs.items()}
    if by_seed and len(by_seed) > 1:
        replicate_latency(by_seed, out)
    which = " (the first seed)" if by_seed and len(by_seed) > 1 else ""
    print(f"\nSend latency{which} (s, slowest worker per iteration; iteration 0 = connection warm-up, left out):")
    hdr = ["run", "p50", "p99", "tail (max)", "average", "recv up mean", "recv up min",
           "recv down mean", "recv down min", "rounds >1 pass"]
    rows = [hdr] + [[k, _fmt(s.p50), _fmt(s.p99), _fmt(s.tail_max), _fmt(s.mean),
                     _fmt(fr[k]["up_mean"]), _fmt(fr[k]["up_min"]), _fmt(fr[k]["down_mean"]),
                     _fmt(fr[k]["down_min"]), _fmt(fr[k]["retx_rounds"], ".1%")] for k, s in sums.items()]
    print(analysis.format_table(rows))
    if "baseline" in sums and "dblp" in sums:
        b, d = sums["baseline"], sums["dblp"]
        sp = [["speedup of DBLP over the baseline", "p99", "tail (max)", "average"],
              ["baseline / dblp"] + [f"{x / y:.2f}x" if y and y > 0 else "nan"
                                     for x, y in ((b.p99, d.p99), (b.tail_max, d.tail_max), (b.mean, d.mean))]]
        print()
        print(analysis.format_table(sp))
    print(f"\nLoss replayed (trace file mean {trace.mean_loss():.4%}; means over each run's rounds):")
    lrow = [["run", "trace (requested)", "achieved schedule", "trace while up", "trace while down", "kernel up",
             "kernel down", "records up", "records down"]]
    for k, s in losses.items():
        kern = s.get("kernel") or {}
        ku = next((c["fraction"] for lbl, c in kern.items() if ":ingress:" in lbl), None)
        kd = next((c["fraction"] for lbl, c in kern.items() if ":egress:" in lbl), None)
        r = s["records"]
        exact = k == "reliable"
        ex = s.get("while_sending") or {}
        lrow.append([k, _fmt(s["requested_mean_loss"], ".4%"), (_fmt(s["achieved_mean_loss"], ".4%") if "achieved_mean_loss" in s else "per packet"),
                     _fmt(ex.get("up", float("nan")), ".4%"), _fmt(ex.get("down", float("nan")), ".4%"),
                     _fmt(ku, ".4%") if ku is not None else "-", _fmt(kd, ".4%") if kd is not None else "-",
                     _fmt(r["up"]["loss"], ".4%") + ("" if exact else "*"),
                     _fmt(r["down"]["loss"], ".4%") + ("" if exact else "*")])
    print(analysis.format_table(lrow))
    print("  trace while up/down = the trace's mean over the windows each direction was sending (datagram-weighted)")
    print("  kernel = the replay rules' drop counters (datagrams dropped / seen on the server's link); records =\n"
          "  1 - delivered/sent from the run's RoundRecords (exact for reliable; * a bounded-loss run also counts\n"
          "  datagrams still in flight when STOP came, and queue drops at the bottleneck count everywhere).")
    for k, s in losses.items():
        if "wake_lag_ms" in s:
            lag = s["wake_lag_ms"]
            print(f"  {k}: {s['changes']} rule swaps, {s['skipped']} skipped (late), wake-up lag p50 "
                  f"{_fmt(lag['p50'], '.2f')} ms p99 {_fmt(lag['p99'], '.2f')} ms")
    # files
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run", "p50_s", "p99_s", "max_s", "mean_s", "up_frac_mean", "up_frac_min", "down_frac_mean",
                    "down_frac_min", "retx_rounds", "trace_loss", "achieved_loss", "kernel_up", "kernel_down",
                    "records_up", "records_down", "trace_while_up", "trace_while_down"])
        for k, s in sums.items():
            L = losses[k]
            kern = L.get("kernel") or {}
            w.writerow([k, s.p50, s.p99, s.tail_max, s.mean, fr[k]["up_mean"], fr[k]["up_min"], fr[k]["down_mean"],
                        fr[k]["down_min"], fr[k]["retx_rounds"], L["requested_mean_loss"],
                        L.get("achieved_mean_loss", ""),
                        next((c["fraction"] for lbl, c in kern.items() if ":ingress:" in lbl), ""),
                        next((c["fraction"] for lbl, c in kern.items() if ":egress:" in lbl), ""),
                        L["records"]["up"]["loss"], L["records"]["down"]["loss"],
                        (L.get("while_sending") or {}).get("up", ""), (L.get("while_sending") or {}).get("down", "")])
    with open(out / "rounds.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run", "round", "latency_s", "up_passes", "up_frac_min", "down_frac_min", "loss_seen"])
        for k, recs in runs.items():
            r_, lat = analysis.per_round(recs)
            _, passes = analysis.per_round(recs, "up_passes")
            _, upf = analysis.per_round(recs, "up_frac", role="server", agg="min")
            _, dnf = analysis.per_round(recs, "down_frac", agg="min")
            ex = exposure.get(k, {})
            for i, rnd in enumerate(r_.tolist()):
                w.writerow([k, rnd, lat[i], int(passes[i]), upf[i] if i < len(upf) else "",
                            dnf[i] if i < len(dnf) else "", ex.get(rnd, "")])
    (out / "summary_runs.json").write_text(json.dumps(
        {k: {**s.as_dict(), **fr[k], "loss": losses[k]} for k, s in sums.items()}, indent=1, default=str))
    title = f"Send latency per iteration, trace {Path(a.trace).name}"
    analysis.plot_latency(runs, out / "latency.png", (), title)
    analysis.plot_cdf(runs, out / "cdf.png", f"CDF of send latency, trace {Path(a.trace).name}")
    from emulation.replayloss import datagram_loss_by_round, plot_loss

    if exposure:  # segments: the replayed schedule's mean over each iteration
        plot_loss(runs, exposure, out / "loss.png", Path(a.trace).name)
        print(f"\nwrote {out}/summary.csv, rounds.csv, rounds.jsonl, latency.png, cdf.png, loss.png, "
              "<policy>/achieved.loss.csv")
    else:  # packets: no clock to average over, the records' measured loss instead
        plot_loss(runs, {k: datagram_loss_by_round(v) for k, v in runs.items()}, out / "loss.png",
                  Path(a.trace).name, what="datagrams lost (records,\nboth directions)")
        print(f"\nwrote {out}/summary.csv, rounds.csv, rounds.jsonl, latency.png, cdf.png, loss.png (the loss the "
              "records measured per iteration)\n  no <policy>/achieved.loss.csv: a packets trace is applied "
              "exactly, verdict k to the k-th datagram, so what was applied is the trace itself "
              "(the rule changes are in <policy>/replay.jsonl)")


def replicate_latency(by_seed: dict[int, dict[str, list]], out: Path) -> None:
    """The send-latency figures over the seeds: medians [95% intervals of the mean] per run
    (:func:`dblp.results.analysis.replicate_table`), the DBLP-baseline verdict per figure, and the long rows
    in ``table_latency_replicates.csv``."""
    tables = []
    for runs in by_seed.values():
        rows: list[list[object]] = [["run", "p50 (s)", "p99 (s)", "tail (max, s)", "average (s)"]]
        for k, recs in runs.items():
            s = analysis.summarize(recs)
            rows.append([k, s.p50, s.p99, s.tail_max, s.mean])
        tables.append(rows)
    compare = ("dblp", "baseline") if {"dblp", "baseline"} <= set(tables[0][r][0] for r in range(1, len(tables[0]))) \
        else None
    rows, long = analysis.replicate_table(tables, compare=compare)
    print(f"\nSend latency over {len(by_seed)} seeds (slowest worker per iteration): median [95% interval of the "
          "mean, Student t]; paired differences per seed (interleaved runs)")
    print(analysis.format_table(rows))
    if compare:
        print("\n".join(analysis.verdicts(long, rows[0][1:], compare)))
    with open(out / "table_latency_replicates.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(long)


if __name__ == "__main__":
    from emulation.runstate import exit_main

    exit_main(main, "trace_replay.py")
