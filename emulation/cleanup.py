"""Remove what a killed emulation run left behind. Safe to run when nothing is left.

    python -m emulation.cleanup            # clean up, print what was removed
    python -m emulation.cleanup --dry-run  # only show what would be removed

A normal exit, an exception or Ctrl-C already tear down (``EmuNet.stop``);
this is for ``kill -9``, a crashed interpreter or a lost terminal. It does the
job of ``mn -c`` for this testbed, but touches only what the testbed made
(ownership marks: :mod:`emulation.runstate`), so a plain Mininet session
running beside it keeps its shells, bridges and links:

1. state files ``/run/dblpem/<run>.json`` of runs whose process is gone (its
   pid, or its pid now names a process with another start time): kill every
   process in the run's host namespaces, delete the bridges and switch-side
   veths it recorded, restore the sysctls it changed - the machine's own values, as recorded in
   ``/run/dblpem/machine.settings`` by the first run that changed them, once no run is live (a
   live run restores them at its end: the record outlives the dead run's state file);
2. processes tagged ``DBLPEM_RUN=<run>`` whose run is gone (the run's Mininet
   shells and what ``EmuNet.popen`` started), and every process in their
   namespaces when those carry the run's label; ``mininet:`` shells without
   the tag are a plain Mininet session's and are left alone (``mn -c`` cleans those);
3. namespace hosts of ``emulation.nshosts`` (``dblpns-*``) whose creator is gone;
4. bridges carrying our ifalias ``dblpem pid=<creator> start=<ticks>`` whose
   creator is gone (and the veths enslaved to them), root-namespace nft tables
   named after a process that is gone (``dblp_loss_sw<pid>``,
   ``dblp_loss_replay<pid>_<n>``), network namespaces ``dblpem-netem-<pid>``;
5. shared-memory slots ``/dev/shm/dblp-local-<pid>-*`` (:mod:`dblp.transport.hostlocal`) whose worker is gone.

Ownership is proven before anything is killed or deleted: a recorded namespace
counts only while it still has the recorded inode *and* carries the run's label
inside it (the kernel reuses a freed namespace inode within seconds); a process
is signalled only while its start time is the one seen when it was found. A
namespace that fails the proof is reported ("now somebody else's") and left.

Other sessions' ``dblp-*`` namespaces and ``dblp*`` tables without an owner in
their name are left alone unless ``--all-dblp`` is given (they may belong to a
test running right now). Live runs (their process still exists) are never
touched unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dblp.transport import hostlocal
from traces.units import HelpFormatter

from .runstate import (RunLock, RunStates, forget_machine_sysctls, machine_path, machine_sysctls, netns_label,
                       netns_label_of, owned_netns, pid_alive, read_states, run_tag, stale_bridge, state_dir)
from .sysutil import (kill_pids, links, netns_inode, pids_by_netns, pids_with_cmdline_prefix, proc_start,
                      root_netns_inode, run, sysctl_get, sysctl_set)
from traces.argtypes import add_verbosity, add_version

#: What one cleanup may sweep besides the runs its registry records (the default: everything).
SWEEPS = frozenset({"strays", "bridges", "nft", "netns", "slots"})
#: Root-namespace nft tables whose name carries the creating process (emulation.loss switch ends,
#: emulation.replay): removed only when that process is gone.
_OWNED_TABLE = re.compile(r"dblp_loss_sw(\d+)|dblp_loss_replay(\d+)_\d+")


@dataclass
class Plan:
    """What cleanup would remove, found without changing anything (``leftovers`` is its summary)."""

    dead_runs: list[tuple[Path, dict]] = field(default_factory=list)
    run_pids: dict[str, list[int]] = field(default_factory=dict)  # run -> pids in its namespaces
    run_intfs: dict[str, list[str]] = field(default_factory=dict)  # run -> recorded root intfs
    processes: list[int] = field(default_factory=list)  # tagged strays and their namespaces
    bridges: list[str] = field(default_factory=list)
    bridge_ports: list[str] = field(default_factory=list)
    nft_tables: list[tuple[str, str]] = field(default_factory=list)  # (family, name)
    netns: list[str] = field(default_factory=list)
    foreign_shells: list[int] = field(default_factory=list)  # plain Mininet's: never touched
    slots: list[Path] = field(default_factory=list)  # host-local slots of dead workers (dblp.transport.hostlocal)
    starts: dict[int, int] = field(default_factory=dict)  # pid -> start time when found (kills check it)
    not_ours: dict[str, list[int]] = field(default_factory=dict)  # run -> recorded netns inodes now another's
    nft_kept: list[str] = field(default_factory=list)  # root tables of a live process, or without an owner


def _plan(states: RunStates, all_dblp: bool = False, sweeps: frozenset[str] = SWEEPS,
          strays_of: set[str] | None = None) -> Plan:
    """Find leftovers of dead runs; never anything of a live run or of somebody else.

    ``sweeps``: which searches beyond the registry's own records to make (:data:`SWEEPS`).
    ``strays_of``: tagged processes count as strays only for these run ids (None: any run
    that is not live).
    """
    plan = Plan(dead_runs=list(states.dead))
    by_ns = pids_by_netns()
    protected_intfs = states.live_names
    root_ino = root_netns_inode()
    existing = {link.get("ifname", ""): link for link in links()}
    stale = {n for n, link in existing.items() if link.get("linkinfo", {}).get("info_kind") == "bridge"
             and stale_bridge(link.get("ifalias"))}

    def made_by_us(name: str) -> bool:
        """A name a dead run recorded is deleted only if what carries it now is still that run's:
        a testbed bridge whose creator is gone, or a port on none or on such a bridge (the name
        was recorded before creation, and somebody else may have taken it since)."""
        link = existing.get(name)
        if link is None or name in protected_intfs:
            return False
        if link.get("linkinfo", {}).get("info_kind") == "bridge":
            return name in stale
        return link.get("master") in (None, *stale)

    for f, st in states.dead:
        rid = str(st.get("run_id", f.stem))
        recorded = {int(i) for i in st.get("netns_inodes", []) if str(i).isdigit()} - states.live_netns
        mine, other = owned_netns(rid, recorded, by_ns)
        plan.run_pids[rid] = sorted(p for i in mine for p in by_ns.get(i, []))
        if other:
            plan.not_ours[rid] = sorted(other)
        plan.run_intfs[rid] = [n for n in st.get("bridges", []) + st.get("root_intfs", []) if made_by_us(n)]

    # processes: our tag says which run started them; no tag, not ours
    if "strays" in sweeps:
        me = os.getpid()
        tagged: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                tag = run_tag(int(entry))
                if tag is not None and tag not in states.live and (strays_of is None or tag in strays_of):
                    tagged[int(entry)] = tag
        swept: set[int] = set(tagged)
        for ino in {i for p in tagged if (i := netns_inode(p)) and i != root_ino} - states.live_netns:
            pids = by_ns.get(ino, [])
            # the namespace of a stray is swept only when it carries the stray's run's label
            label = next((lab for p in pids[:3] if (lab := netns_label_of(p, ino)) is not None), None)
            if label is not None and label in {netns_label(t) for p, t in tagged.items() if p in pids}:
                swept |= set(pids)
        plan.processes = sorted(swept)
        plan.foreign_shells = [p for p in pids_with_cmdline_prefix("mininet:")
                               if run_tag(p) is None and not states.owned_by_live(p)]
    for p in {p for v in plan.run_pids.values() for p in v} | set(plan.processes):
        if (st_ := proc_start(p)) is not None:
            plan.starts[p] = st_

    recorded = {n for v in plan.run_intfs.values() for n in v}
    if "bridges" in sweeps:
        for name in sorted(stale - protected_intfs - recorded):
            plan.bridges.append(name)
            plan.bridge_ports += [n for n, l in existing.items()
                                  if l.get("master") == name and n not in protected_intfs]

    if "nft" in sweeps:
        out = run(["nft", "-j", "list", "tables"], check=False)
        try:
            tables = [i["table"] for i in json.loads(out).get("nftables", []) if "table" in i]
        except (json.JSONDecodeError, AttributeError):
            tables = []
        for t in tables:
            name = t.get("name", "")
            m = _OWNED_TABLE.fullmatch(name)
            owner = int(m.group(1) or m.group(2)) if m else None
            if (owner is not None and not pid_alive(owner)) or (all_dblp and name.startswith("dblp")):
                plan.nft_tables.append((t.get("family", "inet"), name))
            elif name.startswith("dblp"):
                plan.nft_kept.append(name)

    if "netns" in sweeps:
        plan.netns = [n for n in _netns_names() if
                      (n.startswith("dblpem-netem-") and not _probe_alive(n)) or (all_dblp and n.startswith("dblp"))]
    if "slots" in sweeps:
        plan.slots = [path for path, pid in hostlocal.slots() if not pid_alive(pid)]
    return plan


def cleanup(dry_run: bool = False, all_dblp: bool = False, force: bool = False,
            verbose: bool = True, registry: Path | None = None,
            sweeps: frozenset[str] | None = None) -> dict[str, list]:
    """Remove leftovers; returns what was (or, with dry_run, would be) removed.

    ``registry``: a directory of state files other than ``/run/dblpem`` (tests
    make a dead run of their own there). With it, tagged strays count only for
    the runs recorded there, and ``sweeps`` (default: only those strays with a
    private registry, all of :data:`SWEEPS` without) says which machine-wide
    searches to make too. ``not_ours`` in the result: recorded namespaces left alone because
    they are somebody else's now.
    """
    done: dict[str, list] = {"state_files": [], "processes": [], "interfaces": [], "bridges": [],
                             "nft_tables": [], "netns": [], "sysctls": [], "slots": [], "not_ours": []}

    def say(msg: str) -> None:
        if verbose:
            print(("[dry-run] " if dry_run else "") + msg)

    if sweeps is None:
        sweeps = SWEEPS if registry is None else frozenset({"strays"})
    with RunLock():
        _cleanup_locked(done, say, dry_run, all_dblp, force, registry, frozenset(sweeps))
    if verbose and not any(v for k, v in done.items() if k != "not_ours"):
        print("nothing to clean up")
    return done


def _cleanup_locked(done: dict[str, list], say: Callable[[str], None], dry_run: bool,
                    all_dblp: bool, force: bool, registry: Path | None, sweeps: frozenset[str]) -> None:
    states = read_states(directory=registry)
    if force:
        states.dead += [(state_dir(registry) / f"{rid}.json", st) for rid, st in states.live.items()
                        if int(st.get("pid", 0)) != os.getpid()]
        states.live = {}
    for rid, st in states.live.items():
        say(f"skipping live run {rid} (pid {st.get('pid')}); use --force to clean it too")
    strays_of = None if registry is None else {str(st.get("run_id", f.stem)) for f, st in states.dead}
    plan = _plan(states, all_dblp, sweeps, strays_of)

    def delete_link(name: str) -> None:
        if not dry_run:
            run(["ip", "link", "del", name], check=False)

    # 1. state files of dead runs
    restore: dict[str, str] = {}
    for f, st in plan.dead_runs:
        rid = str(st.get("run_id", f.stem))
        for ino in plan.not_ours.get(rid, []):
            say(f"run {rid}: namespace {ino} it recorded is somebody else's now (no label "
                f"'{netns_label(rid)}' inside): left alone")
            done["not_ours"].append(ino)
        pids = plan.run_pids.get(rid, [])
        if pids:
            say(f"run {rid}: killing {len(pids)} processes in its namespaces")
            done["processes"] += pids
            if not dry_run:
                kill_pids(pids, grace_s=0.5, starts=plan.starts)
        for name in plan.run_intfs.get(rid, []):
            if Path("/sys/class/net", name).exists() or dry_run:
                say(f"run {rid}: deleting interface {name}")
                done["interfaces"].append(name)
                delete_link(name)
        restore.update(st.get("sysctls") or {})
        done["state_files"].append(str(f))
        if not dry_run:
            f.unlink(missing_ok=True)
    # the machine's record of its own values beats what a dead run recorded (a run started after
    # another's kill -9 recorded the changed value as its "before")
    machine = machine_sysctls(registry)
    restore.update(machine)
    # a live run still needs its settings and restores them itself; with a private registry the
    # machine's runs count too (a test's dead run must not restore under a live run's feet)
    live = set(states.live) | (set(read_states().live) if registry is not None else set())
    if restore and live:
        say(f"keeping the sysctls the dead runs changed: {len(live)} run{'s' * (len(live) != 1)} still live"
            + (f"; the machine's own values stay recorded in {machine_path(registry)} for the last run "
               f"to restore" if machine else ""))
    if not live:
        failed = []
        for key, val in restore.items():
            if sysctl_get(key) != val:
                say(f"restoring sysctl {key} = {val}")
                done["sysctls"].append(key)
                if not dry_run and not sysctl_set(key, val):
                    failed.append(key)
        if machine and not dry_run and not failed:
            forget_machine_sysctls(registry)  # back in place, and no run left to change them
            done["state_files"].append(str(machine_path(registry)))

    # 2. processes a dead run started (its Mininet shells included)
    if plan.processes:
        say(f"killing {len(plan.processes)} stray emulation processes: {plan.processes[:20]}")
        done["processes"] += plan.processes
        if not dry_run:
            kill_pids(plan.processes, grace_s=0.5, starts=plan.starts)
    if plan.foreign_shells:
        say(f"leaving {len(plan.foreign_shells)} Mininet shells no testbed run started "
            "(a plain Mininet session's; `mn -c` cleans those)")

    # 4a. our bridges whose creator is gone, and the veths on them
    for name in plan.bridge_ports:
        if Path("/sys/class/net", name).exists() or dry_run:
            say(f"deleting veth {name} (port of a stale testbed bridge)")
            done["interfaces"].append(name)
            delete_link(name)
    for name in plan.bridges:
        say(f"deleting bridge {name}")
        done["bridges"].append(name)
        delete_link(name)

    # 4b. nft tables in the root namespace
    if plan.nft_kept:
        say(f"leaving nft tables {', '.join(plan.nft_kept)} (their creator lives, or their name names "
            "none; --all-dblp removes those without an owner)")
    for family, name in plan.nft_tables:
        say(f"deleting nft table {family} {name}")
        done["nft_tables"].append(f"{family} {name}")
        if not dry_run:
            run(["nft", "delete", "table", family, name], check=False)

    # 4c. named network namespaces
    for name in plan.netns:
        pids = [int(p) for p in run(["ip", "netns", "pids", name], check=False).split()]
        say(f"deleting netns {name} ({len(pids)} processes)")
        done["netns"].append(name)
        if not dry_run:
            kill_pids(pids, grace_s=0.5)
            run(["ip", "netns", "del", name], check=False)

    # 5. shared-memory slots of workers killed in their handshake (named after their dead creator)
    for path in plan.slots:
        say(f"deleting host-local slot {path}")
        done["slots"].append(str(path))
        if not dry_run:
            path.unlink(missing_ok=True)


def leftovers(registry: Path | None = None) -> dict[str, list]:
    """What a finished or killed emulation run left behind (empty lists = clean).

    Exactly what ``cleanup`` would remove: things of runs still alive (e.g. a
    scenario running in another terminal) or of a plain Mininet session are not
    leftovers. Used by the tests (``registry``: as in :func:`cleanup`).
    """
    states = read_states(directory=registry)
    plan = _plan(states, sweeps=SWEEPS if registry is None else frozenset({"strays"}),
                 strays_of=None if registry is None else {str(st.get("run_id", f.stem)) for f, st in states.dead})
    shells = set(pids_with_cmdline_prefix("mininet:"))
    recorded = {n for v in plan.run_intfs.values() for n in v}
    bridges = {n for n in recorded if Path("/sys/class/net", n, "bridge").exists()}
    return {"interfaces": sorted((recorded - bridges) | set(plan.bridge_ports)),
            "bridges": sorted(bridges | set(plan.bridges)),
            "shells": [p for p in plan.processes if p in shells],
            "processes": [p for p in plan.processes if p not in shells],
            "nft_tables": [n for _, n in plan.nft_tables],
            "netns": plan.netns,
            "slots": [str(p) for p in plan.slots],
            # the machine's record of its own values once no run is left to restore it
            "state_files": [str(f) for f, _ in plan.dead_runs]
            + ([str(machine_path(registry))] if machine_sysctls(registry) and not states.live else [])}


def _netns_names() -> list[str]:
    out = run(["ip", "-j", "netns", "list"], check=False)
    try:
        return [n["name"] for n in json.loads(out)] if out.strip() else []
    except json.JSONDecodeError:
        return []


def _probe_alive(name: str) -> bool:
    """``dblpem-netem-<pid>`` is a netem probe in progress while <pid> lives."""
    m = re.fullmatch(r"dblpem-netem-(\d+)", name)
    return bool(m) and pid_alive(int(m.group(1)))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m emulation.cleanup", description=__doc__, formatter_class=HelpFormatter)
    add_version(ap)  # every entry point answers --version
    ap.add_argument("--dry-run", action="store_true", help="show what would be removed, remove nothing")
    ap.add_argument("--all-dblp", action="store_true",
                    help="also remove dblp-* netns and dblp* nft tables of other testbed tools")
    ap.add_argument("--force", action="store_true", help="also clean runs whose process is still alive")
    add_verbosity(ap)  # -q: print nothing about what is removed
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if os.geteuid() != 0:
        print("emulation.cleanup: must run as root", file=sys.stderr)
        return 1
    cleanup(dry_run=a.dry_run, all_dblp=a.all_dblp, force=a.force, verbose=not a.quiet)
    if not a.dry_run:
        # namespace hosts without Mininet (emulation.nshosts): those whose creator is gone
        from .nshosts import cleanup_stale

        for name in cleanup_stale(all_=a.force):
            if not a.quiet:
                print(f"removed namespace host {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
