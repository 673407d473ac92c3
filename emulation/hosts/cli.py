"""``python -m emulation.hosts``: check an inventory, run it, or (on a host) the agent's commands."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from traces.units import HelpFormatter

from .agent import add_keep_args, add_worker_args, host_facts, keep_main, worker_main
from .commands import host_script, server_argv, worker_argv
from .inventory import ROOT, TORCH_POLICIES, HostsError, HostSpec, Inventory, InventoryError, load_inventory
from .launcher import launch
from .rules import loss_targets
from .transport import SshTransport, Transport
from traces.argtypes import add_verbosity, add_version


def describe(inv: Inventory) -> str:
    """The commands each host would run (addresses of netns/local hosts shown as <ip of NAME>)."""

    class _Dry(Transport):
        name = inv.run.transport

        def data_address(self, host: HostSpec) -> str:
            if inv.run.transport == "ssh":
                return host.data_address or host.address
            return "127.0.0.1" if inv.run.transport == "local" else f"<ip of {host.name}>"

    tr: Transport = SshTransport(inv) if inv.run.transport == "ssh" else _Dry(inv)
    srv = inv.server
    rdir = f"{inv.run.remote_dir.rstrip('/')}/<run>-<policy>-"
    lines = [f"transport {inv.run.transport}; {len(inv.workers)} workers; {inv.rounds} iterations; "
             f"policies {', '.join(inv.run.policies)}; mode {inv.run.mode}"]
    for policy in inv.run.policies:
        torch_run = policy in TORCH_POLICIES
        lines.append(f"[{policy}]" + (" torch's all-reduce among the workers; no server, no loss rules"
                                      if torch_run else ""))
        if not torch_run:
            sa = server_argv(inv, policy, rdir + srv.name, tr.bind_address(srv), inv.run.port,
                             round_hook="<round hook of the kept agent>" if inv.burst_starts() else None)
            lines.append(f"  {srv.name} (server): {shlex.join(tr.argv(srv, host_script(srv, rdir + srv.name, 'server', sa)))}"
                         if inv.run.transport == "ssh" else f"  {srv.name} (server): {shlex.join(sa)}")
        for wid, h in enumerate(inv.workers):
            wa = worker_argv(inv, h, wid, rdir + h.name, "" if torch_run else tr.data_address(srv),
                             0 if torch_run else inv.run.port, tr.data_address(inv.workers[0]),
                             exchange=policy if torch_run else "dblp")
            lines.append(f"  {h.name} (worker {wid}{', gpu' if h.gpu else ''}): "
                         + (shlex.join(tr.argv(h, host_script(h, rdir + h.name, 'worker', wa)))
                            if inv.run.transport == "ssh" else shlex.join(wa)))
    static, bursts = loss_targets(inv)
    for t, rate in static:
        lines.append(f"loss: {t.label()} {rate:.2%} for the whole run")
    for b in bursts:
        lines.append(f"loss: {', '.join(t.label() for t in b.targets)} {b.loss:.2%} at iteration {b.iteration} "
                     f"for {b.iterations}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m emulation.hosts",
                                 description="Run the real DBLP server and workers on the machines of an inventory file.",
                                 formatter_class=HelpFormatter)
    add_version(ap)  # every entry point answers --version
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="validate an inventory and print the commands each host would run",
                       formatter_class=HelpFormatter)
    c.add_argument("inventory", help="inventory TOML (docs/hosts.md)")
    r = sub.add_parser("run", help="run the inventory's server and workers, gather the records",
                       formatter_class=HelpFormatter)
    r.add_argument("inventory", help="inventory TOML (docs/hosts.md)")
    r.add_argument("--results", default=str(ROOT / "results"), help="parent folder of the run folder")
    f = sub.add_parser("facts", help="(on a host) print this host's facts as JSON", formatter_class=HelpFormatter)
    f.add_argument("--torch", action="store_true", help="import torch for CUDA device names")
    f.add_argument("--workload", default=None, help="check that this training workload's data set is here")
    f.add_argument("--data-root", default="", help="the workload's data folder (default: $DBLP_DATA_ROOT)")
    f.add_argument("--synthetic-data", action="store_true", help="the workload uses random data: nothing to check")
    w = sub.add_parser("worker", help="(on a host) the worker program the launcher starts",
                       formatter_class=HelpFormatter)
    add_worker_args(w)
    k = sub.add_parser("keep", help="(on a host) the kept agent: nft for the launcher, the round hook relayed",
                       formatter_class=HelpFormatter)
    add_keep_args(k)
    add_verbosity(ap)  # -q/-v on every subcommand
    return ap


STOPS = (InventoryError, HostsError, KeyboardInterrupt)


def stopped(prog: str, exc: BaseException) -> int:
    """The exit status of ``prog`` stopped by ``exc`` (one of :data:`STOPS`), with one line on stderr
    saying why: 2 for an inventory that is wrong or a host that failed, 130 for an interrupt, by
    when the launcher has ended its processes and removed the host folders. The command line here
    and ``scenarios/gpu_hosts.py`` both run an inventory and stop the same way."""
    if isinstance(exc, KeyboardInterrupt):
        print(f"{prog}: interrupted; processes ended, host folders removed", file=sys.stderr)
        return 130
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "facts":
            print(json.dumps(host_facts(a.torch, a.workload, a.data_root, a.synthetic_data)))
            return 0
        if a.cmd == "worker":
            return worker_main(a)
        if a.cmd == "keep":
            return keep_main(a)
        inv = load_inventory(a.inventory)
        if a.cmd == "check":
            print(describe(inv))
            return 0
        out = launch(inv, a.results)
        print(f"hosts: done; results in {out}")
        return 0
    except STOPS as exc:
        return stopped("emulation.hosts", exc)


if __name__ == "__main__":
    sys.exit(main())
