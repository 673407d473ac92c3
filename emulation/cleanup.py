"""Remove what a killed emulation run left behind. Safe to run when nothing is left.

    python -m emulation.cleanup            # clean up, print what was removed
    python -m emulation.cleanup --dry-run  # only show what would be removed

A normal exit, an exception or Ctrl-C already tear down (``EmuNet.stop``);
this is for ``kill -9``, a crashed interpreter or a lost terminal. It does the
job of ``mn -c`` for this testbed without assuming Open vSwitch:

1. state files ``/run/dblpem/<run>.json`` of runs whose process is gone:
   kill every process in the run's host namespaces, delete its bridges and
   switch-side veths, restore the sysctls it changed;
2. Mininet shells (``bash ... mininet:<node>``) not owned by a live run, and
   every process in their namespaces; processes tagged ``DBLPEM_RUN=`` by
   ``EmuNet.popen`` whose run is gone;
3. namespace hosts of ``emulation.nshosts`` (``dblpns-*``) whose creator is gone;
4. root-namespace veths named like Mininet's (``<node>-eth<N>``), bridges
   carrying our ifalias ``dblpem``, nft tables ``dblp_loss*``/``dblpem_*``,
   network namespaces ``dblpem-*``.

Other sessions' ``dblp-*`` namespaces and ``dblp_*`` tables are left alone
unless ``--all-dblp`` is given (they may belong to a test running right now).
Live runs (their process still exists) are never touched unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from traces.units import HelpFormatter

from .runstate import STATE_DIR, RunLock, pid_alive, read_states
from .sysutil import (BRIDGE_ALIAS, RUN_ENV, kill_pids, links, netns_inode, pids_in_netns,
                      pids_with_cmdline_prefix, root_netns_inode, run, sysctl_get, sysctl_set)

MININET_INTF = re.compile(r"^[A-Za-z][\w]*-eth\d+$")


def _env_value(pid: int, var: str) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in env.split(b"\0"):
        if item.startswith(var.encode() + b"="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None


def cleanup(dry_run: bool = False, all_dblp: bool = False, force: bool = False,
            verbose: bool = True) -> dict[str, list]:
    """Remove leftovers; returns what was (or, with dry_run, would be) removed."""
    done: dict[str, list] = {"state_files": [], "processes": [], "interfaces": [],
                             "bridges": [], "nft_tables": [], "netns": [], "sysctls": []}

    def say(msg: str) -> None:
        if verbose:
            print(("[dry-run] " if dry_run else "") + msg)

    with RunLock():
        _cleanup_locked(done, say, dry_run, all_dblp, force)
    if verbose and not any(done.values()):
        print("nothing to clean up")
    return done


def _cleanup_locked(done: dict[str, list], say, dry_run: bool, all_dblp: bool,
                    force: bool) -> None:
    root_ino = root_netns_inode()
    states = read_states()
    if force:
        states.dead += [(STATE_DIR / f"{rid}.json", st) for rid, st in states.live.items()
                        if int(st.get("pid", 0)) != os.getpid()]
        states.live = {}
    for rid, st in states.live.items():
        say(f"skipping live run {rid} (pid {st.get('pid')}); use --force to clean it too")
    protected_intfs = states.live_names
    protected_netns = states.live_netns

    # 1. state files of dead runs
    restore: dict[str, str] = {}
    for f, st in states.dead:
        pids = pids_in_netns(st.get("netns_inodes", []))
        if pids:
            say(f"run {st.get('run_id')}: killing {len(pids)} processes in its namespaces")
            done["processes"] += pids
            if not dry_run:
                kill_pids(pids, grace_s=0.5)
        for name in st.get("bridges", []) + st.get("root_intfs", []):
            if name not in protected_intfs and Path("/sys/class/net", name).exists():
                say(f"run {st.get('run_id')}: deleting interface {name}")
                done["interfaces"].append(name)
                if not dry_run:
                    run(["ip", "link", "del", name], check=False)
        restore.update(st.get("sysctls") or {})
        done["state_files"].append(str(f))
        if not dry_run:
            f.unlink(missing_ok=True)
    if not states.live:  # a live run still needs its settings; it restores them itself
        for key, val in restore.items():
            if sysctl_get(key) != val:
                say(f"restoring sysctl {key} = {val}")
                done["sysctls"].append(key)
                if not dry_run:
                    sysctl_set(key, val)

    # 2. stray Mininet shells and tagged processes
    shells = [p for p in pids_with_cmdline_prefix("mininet:") if not states.owned_by_live(p)]
    ns = {i for p in shells if (i := netns_inode(p)) and i != root_ino} - protected_netns
    tagged = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            val = _env_value(int(entry), RUN_ENV)
            if val is not None and val not in states.live:
                tagged.append(int(entry))
    victims = sorted(set(shells) | set(pids_in_netns(ns)) | set(tagged))
    if victims:
        say(f"killing {len(victims)} stray Mininet/emulation processes: {victims[:20]}")
        done["processes"] += victims
        if not dry_run:
            kill_pids(victims, grace_s=0.5)

    # 3a. root-namespace veths and our bridges
    for link in links():
        name = link.get("ifname", "")
        kind = link.get("linkinfo", {}).get("info_kind")
        if name in protected_intfs:
            continue
        if kind == "bridge" and link.get("ifalias") == BRIDGE_ALIAS:
            say(f"deleting bridge {name}")
            done["bridges"].append(name)
            if not dry_run:
                run(["ip", "link", "del", name], check=False)
        elif kind == "veth" and MININET_INTF.match(name) and (all_dblp or not name.startswith("dblp")):
            say(f"deleting veth {name}")
            done["interfaces"].append(name)
            if not dry_run:
                run(["ip", "link", "del", name], check=False)

    # 3b. nft tables in the root namespace
    out = run(["nft", "-j", "list", "tables"], check=False)
    try:
        tables = [i["table"] for i in json.loads(out).get("nftables", []) if "table" in i]
    except (json.JSONDecodeError, AttributeError):
        tables = []
    for t in tables:
        name = t.get("name", "")
        ours = name.startswith("dblp_loss") or name.startswith("dblpem_")
        if ours or (all_dblp and name.startswith("dblp")):
            say(f"deleting nft table {t.get('family')} {name}")
            done["nft_tables"].append(f"{t.get('family')} {name}")
            if not dry_run:
                run(["nft", "delete", "table", t.get("family", "inet"), name], check=False)

    # 3c. named network namespaces
    for name in _netns_names():
        if _probe_alive(name):
            continue
        if name.startswith("dblpem-") or (all_dblp and name.startswith("dblp")):
            pids = [int(p) for p in run(["ip", "netns", "pids", name], check=False).split()]
            say(f"deleting netns {name} ({len(pids)} processes)")
            done["netns"].append(name)
            if not dry_run:
                kill_pids(pids, grace_s=0.5)
                run(["ip", "netns", "del", name], check=False)


def leftovers() -> dict[str, list]:
    """What a finished or killed emulation run could have left behind (empty lists = clean).

    Things that belong to runs still alive (e.g. a scenario running in another
    terminal) are not leftovers and are not listed. Used by the tests.
    """
    states = read_states()
    live_names = states.live_names
    res: dict[str, list] = {"interfaces": [], "bridges": [], "shells": [], "nft_tables": [],
                            "netns": [], "state_files": []}
    for link in links():
        name = link.get("ifname", "")
        if name in live_names:
            continue
        if MININET_INTF.match(name) and not name.startswith("dblp"):
            res["interfaces"].append(name)
        if link.get("ifalias") == BRIDGE_ALIAS:
            res["bridges"].append(name)
    res["shells"] = [p for p in pids_with_cmdline_prefix("mininet:")
                     if not states.owned_by_live(p)]
    out = run(["nft", "-j", "list", "tables"], check=False)
    try:
        for i in json.loads(out).get("nftables", []):
            name = i.get("table", {}).get("name", "")
            if name.startswith("dblp_loss") or name.startswith("dblpem_"):
                res["nft_tables"].append(name)
    except (json.JSONDecodeError, AttributeError):
        pass
    res["netns"] = [n for n in _netns_names() if n.startswith("dblpem-") and not _probe_alive(n)]
    res["state_files"] = [str(f) for f, _ in states.dead]
    return res


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
    ap.add_argument("--dry-run", action="store_true", help="show what would be removed, remove nothing")
    ap.add_argument("--all-dblp", action="store_true",
                    help="also remove dblp-* netns and dblp* nft tables of other testbed tools")
    ap.add_argument("--force", action="store_true", help="also clean runs whose process is still alive")
    ap.add_argument("-q", "--quiet", action="store_true", help="print nothing about what is removed")
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
