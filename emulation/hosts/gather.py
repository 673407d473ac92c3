"""Gathering a run: each host's folder copied back (``tar`` through the transport), placed and counted.

Why ``tar`` over the transport: it needs nothing on the hosts but a shell,
works the same over ssh and in a namespace, and keeps the folder's layout.
The gathered records are placed as the Mininet scenarios place theirs
(``records/server.jsonl``, ``records/worker<i>.jsonl``), so the analysis
and the simulator's calibration read a hosts run like any other.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import shutil
import tarfile
from pathlib import Path
from typing import Any

from dblp.cli.args import pace_arg
from dblp.protocol.records import read_records, write_records
from traces.units import parse_rate

from .inventory import TORCH_POLICIES, HostsError, HostSpec, Inventory
from .transport import Transport


def gather_dir(tr: Transport, host: HostSpec, rdir: str, dest: Path) -> list[str]:
    """Copy a host's run folder into ``dest`` (``tar -C rdir -cf - .`` through the transport)."""
    r = tr.run(host, f"tar -C {shlex.quote(rdir)} -cf - .", timeout=300, text=False)
    if r.returncode != 0:
        raise HostsError(f"host {host.name}: cannot read {rdir}: {r.stderr.decode('utf-8', 'replace').strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(r.stdout), mode="r:") as tf:
        members = [m for m in tf.getmembers() if m.isfile() or m.isdir()]
        tf.extractall(dest, members=members, filter="data")
        return sorted(m.name for m in members if m.isfile())


def remove_dir(tr: Transport, host: HostSpec, rdir: str) -> None:
    if not re.search(r"/[A-Za-z0-9_.-]+-[a-z][a-z0-9]*$", rdir):
        raise HostsError(f"refusing to remove {rdir!r}: not a run folder")
    tr.run(host, f"rm -rf -- {shlex.quote(rdir)}", timeout=60)



def collect_policy(inv: Inventory, policy: str, out: Path, problems: list[str], wall_s: float) -> dict:
    """Place gathered files (records/, compute.csv, rounds.jsonl) and count what arrived."""
    n_rounds = inv.rounds
    counts: dict[str, Any] = {}
    all_recs = []
    compute_rows: list[dict] = []
    srv_file = out / "hosts" / inv.server.name / "records.jsonl"
    if policy in TORCH_POLICIES:  # torch's all-reduce among the workers: no server ran
        pass
    elif srv_file.exists():
        shutil.copyfile(srv_file, out / "records" / "server.jsonl")
        recs = list(read_records(srv_file))
        all_recs += recs
        per_w: dict[int, set] = {}
        for r in recs:
            per_w.setdefault(r.worker, set()).add(r.round)
        counts[inv.server.name] = {"role": "server", "records": len(recs),
                                   "rounds_per_worker": {str(k): len(v) for k, v in sorted(per_w.items())}}
        if len(recs) != n_rounds * len(inv.workers):
            problems.append(f"server {inv.server.name}: {len(recs)} records, expected {n_rounds * len(inv.workers)}")
    else:
        problems.append(f"server {inv.server.name}: no records gathered")
    ids = set()
    for h in inv.workers:
        f = out / "hosts" / h.name / "records.jsonl"
        if not f.exists():
            problems.append(f"worker {h.name}: no records gathered")
            continue
        recs = list(read_records(f))
        wid = recs[0].worker if recs else -1
        ids.add(wid)
        shutil.copyfile(f, out / "records" / f"worker{wid}.jsonl")
        all_recs += recs
        rounds = sorted({r.round for r in recs})
        counts[h.name] = {"role": "worker", "worker": wid, "records": len(recs), "rounds": len(rounds),
                          "device": recs[0].extra.get("device") if recs else None}
        if rounds != list(range(n_rounds)) or len(recs) != n_rounds:
            problems.append(f"worker {h.name}: {len(recs)} records over {len(rounds)} rounds, expected {n_rounds}")
        cf = out / "hosts" / h.name / "compute.csv"
        if cf.exists():
            with open(cf, newline="", encoding="utf-8") as fh:
                for row in csv.DictReader(fh):
                    compute_rows.append({"policy": policy, "host": h.name, **row})
        else:
            problems.append(f"worker {h.name}: no compute.csv")
    if len(ids) != len(inv.workers):
        problems.append(f"worker ids {sorted(ids)}: expected {len(inv.workers)} distinct ids")
    all_recs.sort(key=lambda r: (r.round, r.role, r.worker))

    if (out / "rounds.jsonl").exists():
        (out / "rounds.jsonl").unlink()
    write_records(out / "rounds.jsonl", all_recs)
    write_compute(out / "compute.csv", compute_rows)
    (out / "config.json").write_text(json.dumps(policy_config(inv, policy, all_recs, out), indent=1) + "\n")
    s = {"policy": policy, "rounds": n_rounds, "workers": len(inv.workers), "hosts": counts,
         "problems": problems, "complete": not problems, "wall_s": wall_s}
    (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    return s


def policy_config(inv: Inventory, policy: str, recs: list, out_dir: Path | None = None) -> dict:
    """The run's settings under the names ``dblp.sim.studies.calibrate`` looks up (its ``config.json``)."""
    chunks = max((r.chunks for r in recs), default=0)
    c: dict[str, Any] = {"policy_run": policy, "transport": inv.run.transport, "workers": len(inv.workers),
                         "iterations": inv.rounds, "seed": inv.run.seed, "eta": inv.run.eta, "freq": inv.run.freq,
                         "p_low": inv.run.p_low, "p_high": inv.run.p_high, "mode": inv.run.mode}
    if inv.run.mode == "synthetic":
        from dblp.runs.gradients import model_elements

        c["elements"] = model_elements(inv.run.model)
    else:
        for h in inv.workers:  # the trained model's parameter count, as the worker reported it
            dev = out_dir / "hosts" / h.name / "device.json" if out_dir else None
            if dev is not None and dev.exists():
                n = json.loads(dev.read_text()).get("parameters")
                if n:
                    c["elements"] = int(n)
                    break
        if "elements" not in c and chunks:
            c["chunks"] = chunks
        c["workload"] = inv.train.workload
    if inv.network.bandwidth:
        c["bw"] = parse_rate(inv.network.bandwidth) / 1e6  # Mbit/s, as the Mininet scenarios write it
        c["buffer_pkts"] = inv.network.queue_packets
    rate = pace_arg(inv.run.rate)
    if rate:  # a hand-set rate (auto: self-pacing, no fixed rate to state)
        c["send_rate_bps"] = rate
    return c


COMPUTE_COLUMNS = ["policy", "host", "worker", "round", "compute_s", "exchange_s", "iteration_s", "device"]


def write_compute(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, COMPUTE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def sim_compute_params(rows: list[dict], skip_first: int = 1) -> dict:
    """``compute_s`` (median) and ``compute_jitter_s`` (std) for :class:`dblp.sim.SimConfig`, from compute.csv rows.

    The first ``skip_first`` iterations of each worker are left out (CUDA
    context, cudnn autotuning, first-touch allocations)."""
    import numpy as np

    vals = np.array([float(r["compute_s"]) for r in rows
                     if r.get("compute_s") not in (None, "") and int(r.get("round", 0)) >= skip_first], float)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return {}
    devices = sorted({r.get("device", "") for r in rows if r.get("device")})
    return {"_source": "emulation.hosts: per-iteration compute time of the workers (compute.csv)",
            "_devices": devices, "_samples": int(vals.size), "_p90_s": float(np.percentile(vals, 90)),
            "compute_s": float(np.median(vals)), "compute_jitter_s": float(np.std(vals))}



def policy_comparison(out: Path, policies: list[str], bursts: list[int]) -> list[list[str]]:
    """Every policy of a run side by side, DBLP's and torch's all-reduce alike, from what every
    run writes (``<policy>/compute.csv``, ``hosts/<worker>/train_summary.json``): per iteration
    the slowest worker's exchange (p50, p99, max, at each burst), the iteration time (p50),
    the training time (sum over iterations of the slowest worker's), and the final training
    metric (the workers' mean; ``-`` in synthetic mode). Rows: a header, then one per policy."""
    import numpy as np

    hdr = ["policy", "iterations", "exch p50 s", "exch p99 s", "exch max s"] + [f"exch @{b} s" for b in bursts] \
        + ["iter p50 s", "train time s", "final metric"]
    rows = [hdr]
    for p in policies:
        f = out / p / "compute.csv"
        if not f.exists():
            continue
        ex: dict[int, float] = {}
        it: dict[int, float] = {}
        with open(f, newline="", encoding="utf-8") as fh:
            for r in csv.DictReader(fh):
                k = int(r["round"])
                ex[k] = max(ex.get(k, 0.0), float(r["exchange_s"]))
                it[k] = max(it.get(k, 0.0), float(r["iteration_s"]))
        if not ex:
            continue
        e = np.array([ex[k] for k in sorted(ex)])
        metric = []
        for s in sorted((out / p / "hosts").glob("*/train_summary.json")):
            d = json.loads(s.read_text())
            if d.get("final_metric") is not None:
                metric.append((d.get("metric", ""), float(d["final_metric"])))
        m = f"{metric[0][0]} {np.mean([v for _, v in metric]):.4g}" if metric else "-"
        rows.append([p, str(len(e)), f"{np.median(e):.4f}", f"{np.percentile(e, 99):.4f}", f"{e.max():.4f}"]
                    + [f"{ex[b]:.4f}" if b in ex else "-" for b in bursts]
                    + [f"{np.median(list(it.values())):.4f}", f"{sum(it.values()):.2f}", m])
    return rows
