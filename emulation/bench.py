"""The namespace-host bench behind ``scenarios/benchmark.py``: DBLP runs on real processes with a loss
injector on the server's link, gloo all-reduces beside them, iperf3 flows, and the veth target row.

* :func:`run_dblp`: one DBLP run on :class:`~emulation.nshosts.NsNet` hosts (``python -m dblp server`` /
  ``worker`` through :class:`dblp.runs.launch.Launch`), its lossless rounds followed by calibration and burst
  rounds, each with its loss rule in place for exactly that round;
* :class:`ServerLoss`: that loss injector - an nftables rule on srv's link for the host paths, the
  emulation's own :class:`~emulation.loss.LossController` rules on segmented links;
* :func:`run_gloo`: the gloo reference (:mod:`dblp.runs.glooref`) on the worker hosts, with its own TCP burst;
* :func:`run_iperf`: TCP throughput into srv, one flow or several at once;
* :func:`compare_size`: one tensor size of the comparison - iperf3, every DBLP path, one sender alone,
  gloo - as the rows of ``benchmark.csv`` (:data:`CSV_COLUMNS`; :func:`write_results` writes them);
* :func:`veth_target_rows`: DBLP sharded against gloo on veth, a row of the benchmark's ``--targets``.

The path names (``gso``, ``gso-seg``, ``plain``, ``sharded`` ...) are the benchmark's ``--paths``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dblp.protocol.control import DEFAULT_PORT
from dblp.runs.glooref import GlooError, GlooRanks
from dblp.runs.launch import Launch, LaunchError, RunArgs
from dblp.results.passcost import median, summarize_run
from dblp.protocol.policy import run_policy
from dblp.protocol.records import read_records
from dblp.results.targets import TargetRow
from dblp.transport.watch import Tail
from traces.units import fmt_size

from .loss import LossController, LossTarget, segment_links
from .nshosts import DROP_TABLE, NsHost, NsNet, nft_apply, nft_remove
from .sysutil import CommandError, wait_listening

__all__ = ["BenchError", "CSV_COLUMNS", "DblpRun", "ServerLoss", "bench_env", "compare_size", "gso_probe",
           "run_dblp", "run_gloo", "run_iperf", "summarize", "udp_counters", "veth_target_rows", "write_results", "PATHS", "DEFAULT_PATHS", "SEGMENTED", "CRC_ONLY", "SHARDED",
           "SHARDED_NET", "SHARDED_CRC", "SHARDED_PATHS", "INSECURE_PATHS"]

REPO = Path(__file__).resolve().parent.parent
#: a progress line printer (:class:`dblp.cli.progress.Stamped`)
Say = Callable[[str], None]

#: DBLP's data paths: GSO end to end, GSO on segmented links (the emulation's per-datagram-loss path), plain;
#: ``gso-crc`` is the GSO path on the paper's CRC-only wire (``--insecure``), to price authentication
PATHS = ("gso", "gso-seg", "plain", "gso-crc", "sharded", "sharded-net", "sharded-crc")
DEFAULT_PATHS = ("gso", "gso-seg", "plain", "sharded")
SEGMENTED = "gso-seg"
CRC_ONLY = "gso-crc"
#: the sharded mode (dblp.transport.shard) on the GSO path: a shard server on each worker host, srv idle; a
#: worker's own shard moves through shared memory (dblp.transport.hostlocal); ``sharded-net``: every shard
#: over the network (``--local-shard off``), to price the host-local path; ``sharded-crc``: the sharded
#: mode on the CRC-only wire, to price authentication where the sharded round is CPU-bound
SHARDED = "sharded"
SHARDED_NET = "sharded-net"
SHARDED_CRC = "sharded-crc"
SHARDED_PATHS = (SHARDED, SHARDED_NET, SHARDED_CRC)
#: the paths on the paper's CRC-only wire (``--insecure``)
INSECURE_PATHS = (CRC_ONLY, SHARDED_CRC)
DBLP_PORT = DEFAULT_PORT
GLOO_PORT = 29600
IPERF_PORT = 5201

#: the columns of ``benchmark.csv``, one row per tensor size and DBLP path (:func:`compare_size`)
CSV_COLUMNS = [
    "elements", "tensor_mb", "path", "aggregation", "gso_active", "workers", "p", "rounds", "mtu",
    "dblp_round_s", "dblp_round_min_s", "dblp_up_s", "dblp_down_s",
    "dblp_up_passes", "dblp_up_sent_ratio", "dblp_down_sent_ratio", "udp_rcvbuf_errors",
    "gloo_allreduce_s", "gloo_allreduce_min_s", "ratio_dblp_vs_gloo",
    "dblp_goodput_gbps", "dblp_aggregate_goodput_gbps", "iperf3_gbps", "iperf3_3flows_gbps",
    "ratio_goodput_vs_iperf3", "ratio_aggregate_vs_iperf3_3flows",
    "dblp_solo_goodput_gbps", "dblp_solo_round_s", "ratio_solo_goodput_vs_iperf3",
    "calib_loss", "calib_round_s", "calib_passes_up", "calib_passes_down", "overhead_per_pass_s",
    "sender_share", "wait_per_pass_s",
    "burst_loss", "burst_round_s", "burst_pred_s", "burst_err", "overhead_per_pass_recv_s",
    "burst_pred_recv_s", "burst_err_recv", "burst_passes_up", "burst_passes_down",
    "burst_pred_passes", "burst_timing_ok", "burst_dropped_pkts",
    "gloo_burst_s", "gloo_burst_hold_s", "gloo_burst_timed_out", "ratio_vs_gso_round",
]


class BenchError(RuntimeError):
    """A bench step that failed: hosts that cannot reach each other, a run without progress, a failed iperf3."""


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def bench_env() -> dict:
    """The environment of the processes a bench starts: the repository first on PYTHONPATH, unbuffered output,
    one OpenMP thread (the hosts' cores are the ranks' and servers', not torch's pool's)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def udp_counters(host: NsHost) -> dict[str, int]:
    """The namespace's UDP counters from /proc/net/snmp (InDatagrams, RcvbufErrors, ...)."""
    lines = [ln.split() for ln in host.run(["cat", "/proc/net/snmp"]).stdout.splitlines() if ln.startswith("Udp:")]
    return dict(zip(lines[0][1:], map(int, lines[1][1:]))) if len(lines) >= 2 else {}


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


# -- iperf3 ------------------------------------------------------------------------------
def run_iperf(net: NsNet, clients: list[str], seconds: float, logdir: Path) -> float:
    """TCP throughput from ``clients`` to srv at once; returns the summed Gbit/s."""
    srv = net["srv"]
    servers = [srv.popen(["iperf3", "-s", "-1", "-B", srv.ip, "-p", str(IPERF_PORT + i)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(len(clients))]
    for i, s in enumerate(servers):  # (a sleep here let a client find its server not yet listening)
        try:
            wait_listening(s, IPERF_PORT + i)
        except CommandError as exc:
            raise BenchError(f"iperf3 server on srv: {exc}") from None
    procs = []
    for i, c in enumerate(clients):
        out = open(logdir / f"iperf3-{len(clients)}flows-{c}.json", "w")
        procs.append((net[c].popen(["iperf3", "-c", srv.ip, "-p", str(IPERF_PORT + i), "-t", f"{seconds:g}", "-J",
                                    "--connect-timeout", "3000"], stdout=out, stderr=subprocess.STDOUT), out))
    total = 0.0
    for i, (p, out) in enumerate(procs):
        try:
            p.wait(seconds + 20)
        except subprocess.TimeoutExpired:
            p.kill()
        out.close()
        try:
            res = json.loads(Path(out.name).read_text())
            total += float(res["end"]["sum_received"]["bits_per_second"])
        except (ValueError, KeyError) as exc:
            raise BenchError(f"iperf3 from {clients[i]} failed: {_tail(Path(out.name))}") from exc
    for s in servers:
        try:
            s.wait(5)
        except subprocess.TimeoutExpired:
            s.kill()
    return total / 1e9


# -- DBLP ----------------------------------------------------------------------------------
class ServerLoss:
    """The loss rule on the server's link for one DBLP run.

    Host path (``gso``/``plain``): a table on srv's eth0 hooks, added for a lossy round and
    removed after it. Segmented path: the emulation's own rules (:class:`LossController` on
    segmented links, bridge end of srv's link), loaded at 0% for the whole run and set per round.
    """

    def __init__(self, net: NsNet, segmented: bool) -> None:
        self.srv = net["srv"]
        self.lc = LossController(net, table=DROP_TABLE, segmented=True) if segmented else None
        self.targets = [LossTarget("srv", "ingress"), LossTarget("srv", "egress")]
        self.dropped = 0
        self.set(0.0)

    def set(self, loss: float) -> None:
        if self.lc is None:
            if loss > 0:
                nft_apply(self.srv, "udp", loss)
            return
        for t in self.targets:
            self.lc.set_loss(t, loss)

    def remove(self) -> int:
        """Back to no loss; the packets dropped since the last call."""
        if self.lc is None:
            return nft_remove(self.srv)
        self.set(0.0)
        total = sum(c["dropped_packets"] for c in self.lc.counters().values())
        new, self.dropped = total - self.dropped, total
        return new

    def close(self) -> None:
        if self.lc is not None:
            self.lc.close()


@dataclass
class DblpRun:
    path: str
    elements: int
    rounds: dict = field(default_factory=dict)  # round -> {worker: record}
    udp: dict = field(default_factory=dict)  # host -> UDP counter deltas over the run
    server: list = field(default_factory=list)
    loss_rounds: dict = field(default_factory=dict)  # round -> {loss, t_applied, t_removing, dropped}


def run_dblp(net: NsNet, args, elements: int, path: str, run_idx: int, outdir: Path, say: Say,
             n_workers: int | None = None) -> DblpRun:
    """One DBLP run of ``path`` on the namespace hosts (srv and the first ``n_workers`` of w1..wN) with
    the real CLI: ``args.warmup + args.rounds`` lossless rounds, then (for a path whose rounds cross srv's
    link) ``args.burst_repeats`` times the calibration rounds at ``args.calib_loss`` and one burst round at
    ``args.burst_loss``, each loss rule in place for exactly its round (:class:`ServerLoss`). ``args``: the
    benchmark's settings (``p``, ``gap``, ``timeout``, ``mtu``, ``server_threads``, ``workers``, ...)."""
    n_workers = args.workers if n_workers is None else n_workers
    srv = net["srv"]
    workers = [net[f"w{i + 1}"] for i in range(n_workers)]
    port = DBLP_PORT + run_idx
    first_lossy = args.warmup + args.rounds
    schedule: dict[int, float] = {}
    roles: dict[int, str] = {}
    if args.burst_loss > 0 and path not in SHARDED_PATHS:  # (the loss rule sits on srv's link, which sharded rounds skip)
        # calibrations and burst interleaved, repeated: drift and one-off stalls spread over all
        for _ in range(args.burst_repeats):
            for loss in args.calib_loss:
                roles[first_lossy + len(schedule)] = "calib"
                schedule[first_lossy + len(schedule)] = loss
            roles[first_lossy + len(schedule)] = "burst"
            schedule[first_lossy + len(schedule)] = args.burst_loss
    total = first_lossy + len(schedule)
    outdir.mkdir(parents=True, exist_ok=True)
    for f in outdir.glob("*.jsonl"):  # records append: start from empty files
        f.unlink()
    snmp0 = {h.name: udp_counters(h) for h in [srv, *workers]}
    hosts = [srv.name, *(w.name for w in workers)]
    if path == SEGMENTED:
        segment_links(net, hosts)
    loss = ServerLoss(net, path == SEGMENTED)
    policy = run_policy("fixed" if args.p > 0 else "reliable", p_low=args.p).flags()
    start_line = outdir / "start-line"  # dblp.runs.startline's marks; removed after the run
    launch = Launch(net, "srv", [w.name for w in workers],
                    RunArgs(workers=n_workers, iterations=total, model=elements, policy=policy, source="hosts",
                            compute_s=args.gap, peer_timeout_s=args.timeout, plain=path == "plain", port=port,
                            mtu=args.mtu, insecure=path in INSECURE_PATHS,
                            aggregation="sharded" if path in SHARDED_PATHS else "server",
                            server_extra=["--threads", str(args.server_threads)],
                            # every worker holds its gradient before a round's clock starts, as gloo's ranks do
                            worker_extra=["--start-together", str(start_line)]
                            + (["--local-shard", "off"] if path == SHARDED_NET else [])),
                    records_dir=outdir, log_dir=outdir, env=bench_env(), cwd=REPO, bind=srv.ip)
    run = DblpRun(path, elements)
    tails = [Tail(outdir / f"worker{i}.jsonl") for i in range(n_workers)]
    done = [-1] * n_workers
    active: int | None = None  # round whose loss rule is in place
    last_said = -1
    tag = f"dblp {fmt_size(elements)} {path}" + (f" {n_workers} worker" if n_workers != args.workers else "")
    deadline = time.monotonic() + args.timeout * (total + 2)
    try:
        launch.start()
        while min(done) < total - 1:
            for i in range(n_workers):
                for r in tails[i].records():
                    run.rounds.setdefault(r["round"], {})[r["worker"]] = r
                    done[i] = max(done[i], r["round"])
            low = min(done)
            if active is not None and low >= active:
                info = run.loss_rounds[active]
                info["t_removing"] = time.time()
                info["dropped"] = loss.remove()
                say(f"{tag}: round {active} at {info['loss']:.0%} loss done, rule removed "
                    f"({info['dropped']} packets dropped)")
                active = None
            nxt = low + 1
            if active is None and nxt in schedule and nxt not in run.loss_rounds:
                loss.set(schedule[nxt])
                run.loss_rounds[nxt] = {"loss": schedule[nxt], "role": roles[nxt], "t_applied": time.time()}
                active = nxt
            if low > last_said and low >= 0:
                last_said = low
                r = run.rounds[low]
                span = max(x["t_start"] + x["round_latency_s"] for x in r.values()) - min(x["t_start"] for x in r.values())
                say(f"{tag}: round {low + 1}/{total} done, {span * 1e3:.1f} ms")
            launch.check()
            if time.monotonic() > deadline:
                raise BenchError(f"{tag}: no progress within {args.timeout * (total + 2):.0f} s "
                                 f"(rounds done per worker: {done})")
            time.sleep(0.02)  # well inside --gap, and little CPU taken from the hosts
        launch.wait(args.timeout)
    except LaunchError as exc:
        raise BenchError(f"{tag}: {exc}") from None
    finally:
        if active is not None:
            loss.remove()
        loss.close()
        launch.stop()
        if path == SEGMENTED:
            segment_links(net, hosts, on=False)  # gloo, iperf3 and the other paths run on plain veth
        shutil.rmtree(start_line, ignore_errors=True)
    server_file = outdir / ("server.shard0.jsonl" if path in SHARDED_PATHS else "server.jsonl")
    run.server = [vars(r) for r in read_records(server_file)]  # null -> NaN, as written
    run.udp = {h.name: _delta(udp_counters(h), snmp0[h.name]) for h in [srv, *workers]}
    return run


def run_gloo(net: NsNet, args, elements: int, size_idx: int, burst_hold: float | None, outdir: Path,
             say: Say) -> dict:
    """gloo all-reduces among ranks on w1..wN: ``args.warmup + args.rounds`` timed from the common start to
    the last rank done; with ``burst_hold``, one more under ``args.burst_loss`` TCP loss (each worker's
    ingress) held that long, as long as DBLP's burst round lasted."""
    outdir.mkdir(parents=True, exist_ok=True)
    tag = f"gloo {fmt_size(elements)}"
    ranks = GlooRanks([net[f"w{i + 1}"] for i in range(args.workers)], GLOO_PORT + size_idx,
                      args.gloo_timeout, outdir, env=bench_env(), cwd=REPO)
    res: dict = {"gloo_allreduce_s": float("nan"), "gloo_allreduce_min_s": float("nan"),
                 "gloo_burst_s": float("nan"), "gloo_burst_hold_s": float("nan"), "gloo_burst_timed_out": False}
    try:
        ranks.collect("ready", None, 120)
        times = []
        for i in range(args.warmup + args.rounds):
            start, _ = ranks.run(f"r{i}", elements)
            got = ranks.collect("done", f"r{i}", args.gloo_timeout + 10)
            t = max(m["t_end"] for m in got.values()) - start
            if i >= args.warmup:
                times.append(t)
            say(f"{tag}: all-reduce {i + 1}/{args.warmup + args.rounds}: {t * 1e3:.1f} ms")
        res["gloo_allreduce_s"] = median(times)
        res["gloo_allreduce_min_s"] = min(times)
        res["gloo_times"] = times
        if burst_hold is not None and args.burst_loss > 0:
            for w in ranks.workers:
                nft_apply(w, "tcp", args.burst_loss, hooks=("ingress",))
            start, _ = ranks.run("burst", elements, lead=0.05)
            removed = False
            dropped = 0
            try:
                # hold the rule as long as DBLP's burst round lasted, then lift it
                while time.time() < start + burst_hold:
                    time.sleep(0.002)
                dropped = sum(nft_remove(w) for w in ranks.workers)
                removed = True
                got = ranks.collect("done", "burst", args.gloo_timeout + 10)
                res["gloo_burst_s"] = max(m["t_end"] for m in got.values()) - start
            except (TimeoutError, GlooError) as exc:
                res["gloo_burst_timed_out"] = True
                say(f"{tag}: burst all-reduce did not finish: {exc}")
            finally:
                if not removed:
                    dropped = sum(nft_remove(w) for w in ranks.workers)
            res["gloo_burst_hold_s"] = burst_hold
            res["gloo_burst_dropped_pkts"] = dropped
            say(f"{tag}: all-reduce under {args.burst_loss:.0%} TCP loss held {burst_hold * 1e3:.0f} ms: "
                f"{res['gloo_burst_s'] * 1e3:.1f} ms ({dropped} packets dropped)")
    finally:
        ranks.close()
    return res


def summarize(run: DblpRun, args) -> dict:
    """A run's figures (:func:`dblp.results.passcost.summarize_run`): its lossless rounds after
    ``args.warmup``, its calibration and burst rounds at ``args.calib_loss`` / ``args.burst_loss``."""
    return summarize_run(run.rounds, run.server, run.loss_rounds, elements=run.elements, workers=args.workers,
                         p=args.p, calib_loss=args.calib_loss, lossless=range(args.warmup, args.warmup + args.rounds),
                         udp=run.udp)


def compare_size(net: NsNet, args, elements: int, size_idx: int, run_idx: int, outdir: Path, gso_ok: bool,
                 say: Say) -> tuple[list[dict], dict, int]:
    """One tensor size of the comparison on the namespace hosts, in this order: iperf3 (one flow, then
    every worker at once; ``args.iperf_seconds`` 0 skips it), each DBLP path of ``args.paths``
    (:func:`run_dblp`), the first path (``gso`` where asked for) with one worker alone
    (``args.solo``), gloo (unless ``args.no_gloo``) with its burst held as long as DBLP's shortest
    burst round. ``run_idx``: the first DBLP run's index (its port offset). Returns the CSV rows
    (:data:`CSV_COLUMNS`, one per path), the size's detail for ``benchmark.json``, and the next run index."""
    outdir.mkdir(parents=True, exist_ok=True)
    ip1 = ip3 = float("nan")
    if args.iperf_seconds > 0:
        ip1 = run_iperf(net, ["w1"], args.iperf_seconds, outdir)
        ip3 = run_iperf(net, [f"w{i + 1}" for i in range(args.workers)], args.iperf_seconds, outdir)
        say(f"iperf3: w1->srv {ip1:.2f} Gbit/s; w1,w2,w3->srv {ip3:.2f} Gbit/s")
    dres = {}
    for path in args.paths:
        dres[path] = d = summarize(run_dblp(net, args, elements, path, run_idx, outdir / f"dblp-{path}", say), args)
        run_idx += 1
        say(f"dblp {fmt_size(elements)} {path}: round {d['dblp_round_s'] * 1e3:.1f} ms, "
            f"goodput {d['dblp_goodput_gbps']:.2f} Gbit/s per worker"
            + (f"; burst {d['burst_round_s'] * 1e3:.1f} ms vs predicted {d['burst_pred_s'] * 1e3:.1f} ms"
               if "burst_round_s" in d else ""))
    # One sender alone on its link: DBLP's goodput against iperf3's one flow.
    solo = {}
    if args.solo:
        path0 = "gso" if "gso" in args.paths else args.paths[0]
        sargs = argparse.Namespace(**{**vars(args), "burst_loss": 0.0, "calib_loss": []})
        srun = run_dblp(net, sargs, elements, path0, run_idx, outdir / f"dblp-{path0}-1worker", say, n_workers=1)
        run_idx += 1
        lossless = [srun.rounds[r][0] for r in range(args.warmup, args.warmup + args.rounds)]
        solo = {"path": path0,
                "goodput_gbps": median([elements * 32 / x["up_latency_s"] / 1e9 for x in lossless]),
                "round_s": median([x["round_latency_s"] for x in lossless])}
        say(f"dblp {fmt_size(elements)} {path0}, one worker alone: goodput "
            f"{solo['goodput_gbps']:.2f} Gbit/s, round {solo['round_s'] * 1e3:.1f} ms")
    # gloo's burst lasts as long as DBLP's shortest burst round of this size
    hold = min((d["burst_round_s"] for d in dres.values() if "burst_round_s" in d), default=float("nan"))
    gres = {}
    if not args.no_gloo:
        gres = run_gloo(net, args, elements, size_idx, None if math.isnan(hold) else hold, outdir / "gloo", say)
    rows = []
    for path, d in dres.items():
        row = {c: float("nan") for c in CSV_COLUMNS}
        row.update({"elements": elements, "tensor_mb": elements * 4 / 1e6, "path": path,
                    "gso_active": gso_ok and path != "plain", "workers": args.workers, "p": args.p,
                    "aggregation": "sharded" if path in SHARDED_PATHS else "server", "mtu": args.mtu,
                    "rounds": args.rounds, "iperf3_gbps": ip1, "iperf3_3flows_gbps": ip3})
        row.update({k: v for k, v in d.items() if k in row})
        row.update({k: v for k, v in gres.items() if k in row})
        row["ratio_dblp_vs_gloo"] = row["dblp_round_s"] / row["gloo_allreduce_s"]
        row["ratio_goodput_vs_iperf3"] = row["dblp_goodput_gbps"] / ip1
        if solo.get("path") == path:
            row["dblp_solo_goodput_gbps"] = solo["goodput_gbps"]
            row["dblp_solo_round_s"] = solo["round_s"]
            row["ratio_solo_goodput_vs_iperf3"] = solo["goodput_gbps"] / ip1
        row["ratio_aggregate_vs_iperf3_3flows"] = row["dblp_aggregate_goodput_gbps"] / ip3
        row["burst_timing_ok"] = d.get("burst_timing_ok", "") if "burst_timing_ok" in d else ""
        if d.get("calib_timing_ok") is False or d.get("burst_timing_ok") is False:
            say(f"warning: {fmt_size(elements)} {path}: a loss rule was not in place for exactly "
                f"its round (orchestrator too slow for --gap {args.gap:g} s); burst figures suspect")
        rows.append(row)
    gso_round = dres["gso"]["dblp_round_s"] if "gso" in dres else float("nan")
    for row in rows:
        row["ratio_vs_gso_round"] = row["dblp_round_s"] / gso_round
    detail = {"elements": elements, "iperf3_gbps": ip1, "iperf3_3flows_gbps": ip3, "dblp": dres,
              "dblp_one_worker": solo, "gloo": gres}
    return rows, detail, run_idx


def write_results(out: Path, rows: list[dict], detail: dict) -> None:
    """``benchmark.csv`` (:data:`CSV_COLUMNS`, floats to 6 significant digits) and ``benchmark.json``
    (everything, per round) under ``out``."""
    with open(out / "benchmark.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    (out / "benchmark.json").write_text(json.dumps(detail, indent=1, default=str))


def veth_target_rows(args, say: Say, rep: int) -> list[TargetRow]:
    """Namespace hosts on veth at ``--mtu`` (1500): DBLP sharded against gloo (needs root)."""
    e = args.target_model
    name = f"veth MTU {args.mtu} {fmt_size(e)} x {args.workers}: sharded / gloo"
    if os.geteuid() != 0:
        say(f"{name}: skipped (needs root for namespace hosts)")
        return []
    vargs = argparse.Namespace(**{**vars(args), "burst_loss": 0.0, "calib_loss": []})
    out = args.out / f"rep{rep}" / "veth"
    with NsNet(["srv", *[f"w{i + 1}" for i in range(args.workers)]], mtu=args.mtu) as net:
        if not net.ping_all():
            raise BenchError("namespace hosts cannot reach each other")
        d = summarize(run_dblp(net, vargs, e, SHARDED, 0, out / "dblp-sharded", say), vargs)
        g = run_gloo(net, vargs, e, 0, None, out / "gloo", say)["gloo_allreduce_s"]
    return [TargetRow(name, d["dblp_round_s"] / g, "x", {"2-core": 1.2},
                      detail=f"{d['dblp_round_s'] * 1e3:.0f} / {g * 1e3:.0f} ms")]


def gso_probe(host: NsHost) -> bool:
    """Whether UDP GSO and GRO both work in ``host``'s namespace."""
    r = host.run([sys.executable, "-c", "from dblp.transport.udp import DataSocket; s = DataSocket('127.0.0.1', 0); "
                  "print(int(s.gso and s.gro))"], check=False, env=bench_env())
    return r.stdout.strip() == "1"
