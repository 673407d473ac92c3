"""The launcher: preflight every host, then per policy start the server and workers, apply loss, gather.

One run, per policy of ``[run].policies`` (in order), makes on every host a
fresh folder ``<remote_dir>/<run id>-<policy>-<host>``, starts the server
(waiting for it to listen) and the workers, switches iteration-keyed loss
rules as the server's records show iterations start
(:class:`dblp.watch.RoundWatcher` over ``tail -F`` through the
transport), waits for every process, then gathers each host's folder and
removes it and the nft table - on success, failure and Ctrl-C alike.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..bursts import BurstInjector
from dblp.auth import new_secret
from dblp.launch import LISTENING_RE
from dblp.progress import Progress
from dblp.watch import RoundWatcher
from .commands import server_argv, worker_argv
from .gather import collect_policy, gather_dir, remove_dir, sim_compute_params, write_compute
from .inventory import ROOT, HostsError, HostSpec, Inventory
from .procs import HostProc
from .rules import loss_controller, loss_targets
from .transport import Transport, make_transport


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def _results_dir(root: Path, name: str) -> Path:
    base = root / f"hosts-{name}-{_stamp()}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    path.mkdir(parents=True)
    return path


def preflight(tr: Transport, inv: Inventory) -> dict[str, dict]:
    """Run ``python -m emulation.hosts facts`` on every host (in parallel): checks reachability,
    the python path and the checkout, and CUDA where the inventory says ``gpu = true``."""
    out: dict[str, dict] = {}
    errors: list[str] = []

    def one(h: HostSpec) -> None:
        torch_flag = " --torch" if (h.gpu or (inv.run.mode == "train" and h.role == "worker")) else ""
        script = (f"cd {shlex.quote(h.workdir)} && PYTHONPATH={shlex.quote(h.workdir)} "
                  f"{shlex.quote(h.python)} -m emulation.hosts facts{torch_flag}")
        try:
            r = tr.run(h, script, timeout=120)
        except HostsError as exc:
            errors.append(str(exc))
            return
        if r.returncode != 0:
            errors.append(f"host {h.name}: preflight failed (rc={r.returncode}); check python = {h.python!r} "
                          f"and workdir = {h.workdir!r} there: {r.stderr.strip()[-500:]}")
            return
        try:
            f = json.loads(r.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            errors.append(f"host {h.name}: preflight printed no facts: {r.stdout[-300:]!r} {r.stderr[-300:]!r}")
            return
        if h.gpu and not f.get("cuda_available"):
            errors.append(f"host {h.name}: the inventory says gpu = true but CUDA is not available there "
                          f"(torch {f.get('torch')}, devices {f.get('gpus')}, {f.get('torch_error', '')})")
        out[h.name] = f

    threads = [threading.Thread(target=one, args=(h,)) for h in inv.hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise HostsError("preflight:\n  " + "\n  ".join(errors))
    return out


def run_policy(tr: Transport, inv: Inventory, policy: str, out: Path, run_id: str,
               progress: Callable[[str], None] = print) -> dict:
    """One run of the server and workers under ``policy``; gathers into ``out``. Returns its summary."""
    hosts = inv.hosts
    rdirs = {h.name: f"{inv.run.remote_dir.rstrip('/')}/{run_id}-{policy}-{h.name}" for h in hosts}
    (out / "records").mkdir(parents=True, exist_ok=True)
    procs: list[HostProc] = []
    watcher: RoundWatcher | None = None
    injector = None
    lc = None
    started_dirs: list[HostSpec] = []
    t_begin = time.time()
    n_rounds, n_workers = inv.rounds, len(inv.workers)
    problems: list[str] = []
    failure: BaseException | None = None
    try:
        for h in hosts:
            r = tr.run(h, f"mkdir -p {shlex.quote(rdirs[h.name])}")
            if r.returncode != 0:
                raise HostsError(f"host {h.name}: cannot make {rdirs[h.name]}: {r.stderr.strip()}")
            started_dirs.append(h)
        static, bursts = loss_targets(inv)
        if static or bursts:
            lc = loss_controller(tr)
            for t, rate in static:
                lc.set_loss(t, rate)
            if bursts:
                injector = BurstInjector(lc, bursts, log_path=out / "bursts.jsonl").start()
                injector.on_iteration(0)
        srv = inv.server
        secret = None if inv.insecure else new_secret()  # one per run, to every host in its environment
        bind = tr.bind_address(srv)
        port = 0 if tr.name == "local" else inv.run.port
        sp = HostProc(tr, srv, "server", rdirs[srv.name],
                      server_argv(inv, policy, rdirs[srv.name], bind, port), out / "hosts" / srv.name / "server.log",
                      watch=LISTENING_RE.pattern, secret=secret)
        procs.append(sp)
        if not sp.matched.wait(60) or sp.match is None:
            raise HostsError(f"server on {srv.name} did not start listening:\n{sp.last_lines()}")
        port = int(sp.match.group(1))
        addr = tr.data_address(srv)
        master = tr.data_address(inv.workers[0])

        ticker = Progress(n_rounds, policy, out=progress)

        def on_round(k: int) -> None:
            if injector is not None:
                injector.on_iteration(k)
            ticker.update(k)

        tail = tr.start(srv, f"exec tail -n +1 -s 0.05 -F {shlex.quote(rdirs[srv.name] + '/records.jsonl')} "
                             f"2>/dev/null", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        stdin=subprocess.DEVNULL)
        watcher = RoundWatcher(tail, n_workers, on_round)
        watcher.start()
        for wid, h in enumerate(inv.workers):
            procs.append(HostProc(tr, h, "worker", rdirs[h.name],
                                  worker_argv(inv, h, wid, rdirs[h.name], addr, port, master),
                                  out / "hosts" / h.name / "worker.log", secret=secret))
        deadline = time.time() + inv.run.timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [p for p, c in zip(procs, codes) if c not in (None, 0)]
            if failed:
                f = failed[0]
                raise HostsError(f"{policy}: {f.tag} on {f.host.name} exited with {f.poll()}; "
                                 f"log {f.log_path}:\n{f.last_lines()}")
            if all(c == 0 for c in codes):
                break
            if time.time() > deadline:
                raise HostsError(f"{policy}: not done after run.timeout_s = {inv.run.timeout_s:g} s "
                                 f"({watcher.rounds}/{n_rounds} iterations)")
            time.sleep(0.1)
    except BaseException as exc:
        failure = exc
        problems.append(f"run: {exc}")
    finally:
        if watcher is not None:
            watcher.stop()
        if injector is not None:
            injector.stop()
        for p in procs:
            p.stop()
        gathered: dict[str, list[str]] = {}
        for h in started_dirs:
            try:
                gathered[h.name] = gather_dir(tr, h, rdirs[h.name], out / "hosts" / h.name)
            except Exception as exc:  # noqa: BLE001 - gather what we can, say what we could not
                problems.append(f"gather {h.name}: {exc}")
            if not inv.run.keep_remote:
                try:
                    remove_dir(tr, h, rdirs[h.name])
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"remove {rdirs[h.name]} on {h.name}: {exc}")
        if lc is not None:
            try:
                (out / "loss_counters.json").write_text(json.dumps(lc.counters(), indent=1))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"loss counters: {exc}")
            lc.close()
    summary = collect_policy(inv, policy, out, problems, time.time() - t_begin)
    if failure is not None:
        raise failure
    return summary


def launch(inv: Inventory, results: str | os.PathLike = ROOT / "results",
           progress: Callable[[str], None] = print) -> Path:
    """Run every policy of the inventory and gather the results; returns the results folder.

    Raises :class:`HostsError` when a run fails or records are missing (the
    folder then holds what could be gathered and ``summary.json`` says what)."""
    out = _results_dir(Path(results), inv.run.name)
    if inv.path and Path(inv.path).exists():
        shutil.copyfile(inv.path, out / "inventory.toml")
    (out / "config.json").write_text(json.dumps({**inv.to_dict(), "rounds": inv.rounds, "plain": inv.plain,
                                                 "started": time.time(), "launcher_host": socket.gethostname()},
                                                indent=1) + "\n")
    run_id = f"{inv.run.name}-{_stamp()}-{os.getpid()}"
    summaries: dict[str, dict] = {}
    progress(f"hosts: {len(inv.workers)} workers + server over {inv.run.transport}, {inv.run.mode} "
             f"({inv.train.workload if inv.run.mode == 'train' else inv.run.model}), {inv.rounds} iterations, "
             f"policies {', '.join(inv.run.policies)}\n  results: {out}")
    old_term = None
    if threading.current_thread() is threading.main_thread():  # `kill PID` cleans up like Ctrl-C
        old_term = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    try:
        return _launch(inv, out, run_id, summaries, progress)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _sigterm_to_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _launch(inv: Inventory, out: Path, run_id: str, summaries: dict, progress: Callable[[str], None]) -> Path:
    failure: BaseException | None = None
    facts: dict[str, dict] = {}
    with make_transport(inv) as tr:
        facts = preflight(tr, inv)
        (out / "facts").mkdir()
        for name, f in facts.items():
            (out / "facts" / f"{name}.json").write_text(json.dumps(f, indent=1) + "\n")
        for policy in inv.run.policies:
            progress(f"- {policy}")
            try:
                summaries[policy] = run_policy(tr, inv, policy, out / policy, run_id, progress)
            except BaseException as exc:
                failure = exc
                s = json.loads((out / policy / "summary.json").read_text()) if (out / policy / "summary.json").exists() else {}
                summaries[policy] = {**s, "error": str(exc), "complete": False}
                break
    # devices, compute times for the simulator, overall summary
    devices = {}
    for name, f in facts.items():
        devices[name] = {"role": inv.host(name).role, "gpu": inv.host(name).gpu, "gpus": f.get("gpus", []),
                         "cpu": f.get("cpu", "")}
    rows: list[dict] = []
    for policy in summaries:
        cf = out / policy / "compute.csv"
        if cf.exists():
            with open(cf, newline="", encoding="utf-8") as fh:
                rows += list(csv.DictReader(fh))
        for h, c in summaries[policy].get("hosts", {}).items():
            if c.get("device"):
                devices[h]["device_used"] = c["device"]
    (out / "devices.json").write_text(json.dumps(devices, indent=1) + "\n")
    write_compute(out / "compute.csv", rows)
    simc = sim_compute_params(rows)
    if simc:
        (out / "sim_compute.json").write_text(json.dumps(simc, indent=1) + "\n")
    total = {"policies": summaries, "complete": failure is None and all(s.get("complete") for s in summaries.values()),
             "transport": inv.run.transport}
    (out / "summary.json").write_text(json.dumps(total, indent=1) + "\n")
    if failure is not None:
        if isinstance(failure, KeyboardInterrupt):
            raise failure
        raise HostsError(f"{failure}\n  (partial results in {out})") from failure
    bad = {p: s["problems"] for p, s in summaries.items() if s.get("problems")}
    if bad:
        raise HostsError(f"records incomplete: {bad}\n  (results in {out})")
    return out
