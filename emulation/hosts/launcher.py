"""The launcher: preflight every host, then per policy start the server and workers, apply loss, gather.

One run, per policy of ``[run].policies`` (in order), makes on every host a
fresh folder ``<remote_dir>/<run id>-<policy>-<host>``, starts the server
(waiting for it to listen) and the workers, switches iteration-keyed loss
rules as the server's records show iterations start
(:class:`dblp.transport.watch.RoundWatcher` over ``tail -F`` through the
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
from dblp.protocol.auth import new_secret
from dblp.runs.launch import LISTENING_RE
from dblp.cli.progress import Progress
from dblp.transport.watch import RoundWatcher
from .commands import server_argv, worker_argv
from .gather import collect_policy, gather_dir, remove_dir, sim_compute_params, write_compute
from .inventory import ROOT, TORCH_POLICIES, HostsError, HostSpec, Inventory
from .keep import KeptHost, hook_delays
from .procs import HostProc
from .rules import HostsNet, loss_controller, loss_targets
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


def preflight(tr: Transport, inv: Inventory, progress: Callable[[str], None] = print) -> dict[str, dict]:
    """Run ``python -m emulation.hosts facts`` on every host (in parallel) and refuse a run that would
    fail later: a host unreachable or without the checkout; CUDA missing where ``gpu = true`` (and on
    every worker with the ``nccl`` policy); torch or the training data set missing on a training worker
    (named: ``CIFAR-100 (resnet50's data set) not found under '/data'``); hosts on different commits,
    or with different torch versions when torch's all-reduce runs. Other version differences
    (numpy, Python, uncommitted changes) are printed through ``progress``."""
    out: dict[str, dict] = {}
    errors: list[str] = []
    train = inv.run.mode == "train"

    def one(h: HostSpec) -> None:
        trains = train and h.role == "worker"
        flags = " --torch" if (h.gpu or trains) else ""
        if trains:
            t = inv.train
            flags += f" --workload {shlex.quote(t.workload)}"
            flags += f" --data-root {shlex.quote(t.data_root)}" if t.data_root else ""
            flags += " --synthetic-data" if t.synthetic_data else ""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in h.env.items())  # e.g. DBLP_DATA_ROOT, as the worker sees it
        script = (f"cd {shlex.quote(h.workdir)} && env PYTHONPATH={shlex.quote(h.workdir)} {env} "
                  f"{shlex.quote(h.python)} -m emulation.hosts facts{flags}")
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
        if (h.gpu or (trains and "nccl" in inv.run.policies)) and not f.get("cuda_available"):
            why = "the inventory says gpu = true" if h.gpu else "the nccl policy needs CUDA on every worker"
            errors.append(f"host {h.name}: {why} but CUDA is not available there "
                          f"(torch {f.get('torch')}, devices {f.get('gpus')}, {f.get('torch_error', '')})")
        if trains and f.get("torch_error"):
            errors.append(f"host {h.name}: training needs torch, which does not import there: {f['torch_error']}")
        elif trains and f.get("dataset_problem"):
            errors.append(f"host {h.name}: train.data_root: {f['dataset_problem']}")
        out[h.name] = f

    threads = [threading.Thread(target=one, args=(h,)) for h in inv.hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not errors:
        errors += _version_problems(inv, out, progress)
    if errors:
        raise HostsError("preflight:\n  " + "\n  ".join(errors))
    return out


def _version_problems(inv: Inventory, facts: dict[str, dict], progress: Callable[[str], None]) -> list[str]:
    """Hosts that disagree: a different commit (refused: the wire and the records may differ), a
    different torch where torch's all-reduce runs (refused); other differences printed."""
    def spread(key: Callable[[dict], Any]) -> dict[str, list[str]]:
        by: dict[str, list[str]] = {}
        for name, f in facts.items():
            v = key(f)
            if v is not None:
                by.setdefault(str(v), []).append(name)
        return by

    errors = []
    commits = spread(lambda f: f.get("commit"))
    if len(commits) > 1:
        errors.append("hosts on different commits of this repository: "
                      + "; ".join(f"{c[:12]} on {', '.join(n)}" for c, n in commits.items())
                      + " (check out one commit everywhere)")
    torch_hosts = {h.name for h in inv.workers} if inv.run.mode == "train" else set()
    torches = spread(lambda f: f.get("torch") if f.get("hostname") is not None and f.get("torch") else None)
    torches = {v: [n for n in ns if n in torch_hosts] for v, ns in torches.items()}
    torches = {v: ns for v, ns in torches.items() if ns}
    if len(torches) > 1 and any(p in TORCH_POLICIES for p in inv.run.policies):
        errors.append("training workers with different torch versions cannot share a torch.distributed group: "
                      + "; ".join(f"torch {v} on {', '.join(n)}" for v, n in torches.items()))
    for what, key in (("Python", lambda f: f.get("python")), ("numpy", lambda f: (f.get("versions") or {}).get("numpy")),
                      ("torch", lambda f: (f.get("versions") or {}).get("torch")),
                      ("uncommitted changes", lambda f: f.get("dirty"))):
        by = spread(key)
        if len(by) > 1:
            progress(f"preflight: note: {what} differs: " + "; ".join(f"{v} on {', '.join(n)}" for v, n in by.items()))
    return errors


def run_policy(tr: Transport, inv: Inventory, policy: str, out: Path, run_id: str,
               progress: Callable[[str], None] = print) -> dict:
    """One run of the server and workers under ``policy``; gathers into ``out``. Returns its summary.

    Loss rules go through one kept agent per host that has them (:class:`~.keep.KeptHost`);
    iteration-keyed bursts are switched by the DBLP server's round hook, relayed by the server
    host's agent: round k opens only after its bursts are on (``out/hook.jsonl`` logs each call).
    ``gloo``/``nccl``: the workers train with torch's all-reduce, no DBLP server, no loss rules
    (they are UDP drop rules keyed to the DBLP server's rounds)."""
    torch_run = policy in TORCH_POLICIES
    hosts = inv.workers if torch_run else inv.hosts
    rdirs = {h.name: f"{inv.run.remote_dir.rstrip('/')}/{run_id}-{policy}-{h.name}" for h in hosts}
    (out / "records").mkdir(parents=True, exist_ok=True)
    procs: list[HostProc] = []
    watcher: RoundWatcher | None = None
    injector = None
    lc = None
    kept: dict[str, KeptHost] = {}
    net: HostsNet | None = None  # the loss controller's view of the hosts (through their kept agents)
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
        static, bursts = loss_targets(inv) if not torch_run else ([], [])
        if torch_run and any(h.loss for h in inv.hosts):
            progress(f"  {policy}: torch's all-reduce among the workers, without the inventory's loss rules "
                     "(UDP drop rules keyed to the DBLP server's rounds)")
        srv = inv.server
        ticker = Progress(n_rounds, policy, out=progress)
        seen = [-1]  # the last round the hook saw open

        def on_rounds(first: int, last: int) -> tuple[bool, dict]:
            """The server's round hook (relayed): switch the bursts of the rounds in flight."""
            assert injector is not None and net is not None
            n, before = len(injector.events), dict(net.rules_t)
            on = injector.on_rounds(first, last)
            seen[0] = max(seen[0], last)
            ticker.update(last)
            if len(injector.events) == n:
                return on, {}
            changed = [t for h, t in net.rules_t.items() if before.get(h) != t]
            return on, {"switched": True, "t_rules": max(changed, default=None)}

        if static or bursts:
            rule_hosts = {t.host for t, _ in static} | {t.host for b in bursts for t in b.targets}
            if bursts:
                rule_hosts.add(srv.name)
            for name in sorted(rule_hosts):
                h = inv.host(name)
                kept[name] = KeptHost(tr, h, out / "hosts" / name / "keep.log",
                                      on_rounds=on_rounds if (bursts and name == srv.name) else None,
                                      hook_log=out / "hook.jsonl" if (bursts and name == srv.name) else None)
            lc = loss_controller(tr, kept)
            net = lc.net
            for t, rate in static:
                lc.set_loss(t, rate)
            if bursts:
                injector = BurstInjector(lc, bursts, log_path=out / "bursts.jsonl").start()
        secret = None if inv.insecure else new_secret()  # one per run, to every host in its environment
        master = tr.data_address(inv.workers[0])
        addr, port = "", 0
        if not torch_run:
            bind = tr.bind_address(srv)
            port = 0 if tr.name == "local" else inv.run.port
            hook = kept[srv.name].hook_path if injector is not None else None
            sp = HostProc(tr, srv, "server", rdirs[srv.name],
                          server_argv(inv, policy, rdirs[srv.name], bind, port, round_hook=hook),
                          out / "hosts" / srv.name / "server.log", watch=LISTENING_RE.pattern, secret=secret)
            procs.append(sp)
            if not sp.matched.wait(60) or sp.match is None:
                raise HostsError(f"server on {srv.name} did not start listening:\n{sp.last_lines()}")
            port = int(sp.match.group(1))
            addr = tr.data_address(srv)
            if injector is None:  # progress from the records (no hook needed without bursts)
                tail = tr.start(srv, f"exec tail -n +1 -s 0.05 -F {shlex.quote(rdirs[srv.name] + '/records.jsonl')} "
                                     f"2>/dev/null", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL)
                watcher = RoundWatcher(tail, n_workers, lambda k: ticker.update(k))
                watcher.start()
        for wid, h in enumerate(inv.workers):
            procs.append(HostProc(tr, h, "worker", rdirs[h.name],
                                  worker_argv(inv, h, wid, rdirs[h.name], addr, port, master,
                                              exchange=policy if torch_run else "dblp"),
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
                done = watcher.rounds if watcher is not None else seen[0] + 1
                raise HostsError(f"{policy}: not done after run.timeout_s = {inv.run.timeout_s:g} s "
                                 f"({done}/{n_rounds} iterations)")
            time.sleep(0.1)
    except BaseException as exc:
        failure = exc
        problems.append(f"run: {exc}")
    finally:
        if watcher is not None:
            watcher.stop()
        for p in procs:
            p.stop()
        if injector is not None:
            injector.stop()
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
        for k in kept.values():
            k.close()
        if srv_name := (inv.server.name if injector is not None else None):
            (out / "hook_summary.json").write_text(json.dumps(hook_delays(kept[srv_name].hook_calls), indent=1) + "\n")
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
        facts = preflight(tr, inv, progress)
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
