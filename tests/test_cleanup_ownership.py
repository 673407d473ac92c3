"""Cleanup proves ownership before it kills or deletes.

The kernel hands a freed pid, and a freed network-namespace inode, to the next
process or namespace that asks, within seconds. These tests make a dead run of
their own in a private registry (never ``/run/dblpem``: other runs are live on
this machine) whose recorded ids now name live foreign processes and
namespaces that the tests make, and check that cleanup kills exactly the dead
run's own leftovers and leaves every foreign thing running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest

from emulation.runstate import (bridge_alias, netns_label, netns_label_of, pid_alive, read_states, stale_bridge,
                                write_state)
from emulation.sysutil import RUN_ENV, kill_pids, netns_inode, proc_start, root_netns_inode

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or any(shutil.which(t) is None for t in ("unshare", "nsenter", "ip")),
                                reason="needs root and unshare, nsenter, ip (util-linux, iproute2)")


def _sleeper(env_tag: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
    if env_tag is not None:
        env[RUN_ENV] = env_tag
    return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)


def _ns_process(label: str | None) -> tuple[subprocess.Popen, int]:
    """A process in a network namespace of its own (its loopback labelled ``label``); (process, inode)."""
    env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
    script = ('ip link set dev lo alias "$1" && ' if label else "") + "exec sleep 300"
    p = subprocess.Popen(["unshare", "-n", "sh", "-c", script, "sh", label or ""], env=env, start_new_session=True)
    root = root_netns_inode()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ino = netns_inode(p.pid)
        if ino and ino != root and (label is None or netns_label_of(p.pid, ino) == label):
            return p, ino
        time.sleep(0.02)
    p.kill()
    raise AssertionError("the namespace process did not come up")


def _end(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)


@NEEDS_ROOT
def test_cleanup_leaves_a_recycled_namespace_and_pid_alone(tmp_path):
    from emulation.cleanup import cleanup, leftovers

    rid = f"deadrun-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    own, own_ino = _ns_process(netns_label(rid))  # the dead run's host namespace, still held by a process
    stray = _sleeper(env_tag=rid)  # a process the dead run started (its DBLPEM_RUN)
    # the dead run recorded another namespace; it is freed, and the kernel gives its inode to the
    # next one (the foreign run's): try that for real, and record the foreign inode either way
    gone, gone_ino = _ns_process(netns_label(rid))
    _end(gone)
    deadline = time.monotonic() + 3  # the kernel frees a namespace's inode after an RCU grace: ~1 s
    while True:
        foreign, foreign_ino = _ns_process(None)
        recycled = foreign_ino == gone_ino
        if recycled or time.monotonic() > deadline:
            break
        _end(foreign)
        time.sleep(0.1)
    other_run, other_ino = _ns_process(netns_label("otherrun-1-0123abcd"))  # labelled, but another run's
    reused_pid = _sleeper()  # the dead run's pid, now another process's (other start time)
    procs = [own, stray, foreign, other_run, reused_pid]
    try:
        reg = tmp_path / "registry"
        state = reg / f"{rid}.json"
        write_state(state, {"run_id": rid, "pid": reused_pid.pid, "pid_start": proc_start(reused_pid.pid) - 1,
                            "netns_inodes": sorted({own_ino, gone_ino, foreign_ino, other_ino}),
                            "bridges": [], "root_intfs": [], "sysctls": {}})
        assert [f for f, _ in read_states(directory=reg).dead] == [state]  # its pid names another process

        left = leftovers(registry=reg)
        assert left["state_files"] == [str(state)] and left["processes"] == [stray.pid]
        plan = cleanup(dry_run=True, verbose=False, registry=reg, sweeps=frozenset({"strays"}))
        assert sorted(plan["processes"]) == sorted([own.pid, stray.pid])
        assert all(p.poll() is None for p in procs) and state.exists()  # a dry run touches nothing

        done = cleanup(verbose=False, registry=reg, sweeps=frozenset({"strays"}))
        assert sorted(done["processes"]) == sorted([own.pid, stray.pid])
        assert sorted(done["not_ours"]) == sorted({foreign_ino, other_ino})
        assert done["state_files"] == [str(state)] and not state.exists()
        assert own.wait(timeout=5) is not None and stray.wait(timeout=5) is not None
        assert foreign.poll() is None and other_run.poll() is None and reused_pid.poll() is None
        assert netns_inode(foreign.pid) == foreign_ino  # its namespace untouched
        print(f"namespace inode recycled by the kernel: {recycled}")
    finally:
        _end(*procs)


def test_kill_pids_never_signals_a_reused_pid():
    p = _sleeper()
    try:
        start = proc_start(p.pid)
        assert start is not None
        # found earlier with another start time: the pid now names another process
        assert kill_pids([p.pid], grace_s=0.1, starts={p.pid: start - 1}) == 0
        time.sleep(0.1)
        assert p.poll() is None
        assert kill_pids([p.pid], grace_s=0.5, starts={p.pid: start}) == 1
        assert p.wait(timeout=5) is not None
    finally:
        _end(p)


def test_run_and_bridge_liveness_need_the_start_time(tmp_path):
    me, start = os.getpid(), proc_start(os.getpid())
    assert pid_alive(me) and pid_alive(me, start) and not pid_alive(me, start - 1)
    assert bridge_alias() == f"dblpem pid={me} start={start}"
    assert not stale_bridge(bridge_alias()) and stale_bridge(f"dblpem pid={me} start={start - 1}")
    assert not stale_bridge(f"dblpem pid={me}")  # older alias: pid only
    assert not stale_bridge("somebody else's bridge") and not stale_bridge(None)
    for rid, st in (("a", start), ("b", start - 1), ("c", None)):
        write_state(tmp_path / f"{rid}.json", {"run_id": rid, "pid": me, "pid_start": st})
    states = read_states(directory=tmp_path)
    assert sorted(states.live) == ["a", "c"] and [s["run_id"] for _, s in states.dead] == ["b"]


@NEEDS_ROOT
def test_nshosts_namespace_of_a_reused_creator_pid_is_stale():
    from emulation import nshosts

    ns = f"{nshosts.PREFIX}{os.getpid()}-t{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "dev", "lo", "alias", nshosts._label()], check=True)
        assert nshosts._creator_alive(ns) and nshosts._owner_start(ns) == proc_start(os.getpid())
        label = f"dblpns pid={os.getpid()} start={proc_start(os.getpid()) - 1}"  # our pid, another process
        subprocess.run(["ip", "-n", ns, "link", "set", "dev", "lo", "alias", label], check=True)
        assert not nshosts._creator_alive(ns)
    finally:
        nshosts.delete_namespace(ns)
    assert ns not in nshosts.list_namespaces()


@NEEDS_ROOT
def test_a_private_registry_never_restores_sysctls_under_a_live_run(tmp_path, monkeypatch):
    """A test's dead run (private registry) restores the sysctls it recorded only when no run is live
    in the machine's registry either (here a stand-in registry holding one live run: this process)."""
    from emulation import runstate
    from emulation.cleanup import cleanup

    key = "dblp.test.not_a_real_sysctl"  # never written: dry runs, and no such key
    machine, private = tmp_path / "machine", tmp_path / "private"
    write_state(private / "dead.json", {"run_id": "dead", "pid": 0, "sysctls": {key: "1"}})
    monkeypatch.setattr(runstate, "STATE_DIR", machine)
    assert cleanup(dry_run=True, verbose=False, registry=private)["sysctls"] == [key]  # nothing live: restore
    write_state(machine / "live.json", {"run_id": "live", "pid": os.getpid(), "pid_start": proc_start(os.getpid())})
    assert cleanup(dry_run=True, verbose=False, registry=private)["sysctls"] == []


def test_the_machine_record_keeps_the_first_runs_originals(tmp_path):
    """The first run to change a setting records the machine's value; a later run that sees the changed
    value (its predecessor killed with -9) gets the recorded original back, not what it sees."""
    from emulation.runstate import forget_machine_sysctls, machine_path, machine_sysctls, record_machine_sysctls

    d = tmp_path / "reg"
    assert record_machine_sysctls({"a": "1", "b": "1"}, d) == {"a": "1", "b": "1"}
    assert machine_path(d).name == "machine.settings" and not read_states(directory=d).dead  # not a run's file
    assert record_machine_sysctls({"a": "0", "b": "0", "c": "5"}, d) == {"a": "1", "b": "1", "c": "5"}
    assert machine_sysctls(d) == {"a": "1", "b": "1", "c": "5"}
    forget_machine_sysctls(d)
    assert machine_sysctls(d) == {} and not machine_path(d).exists()
    # no record, but a killed run of the version before it: its state file's "before" still counts
    write_state(d / "old.json", {"run_id": "old", "pid": 0, "sysctls": {"a": "1"}})
    assert record_machine_sysctls({"a": "0", "b": "0"}, d) == {"a": "1", "b": "0"}


@NEEDS_ROOT
def test_cleanup_during_a_second_run_keeps_the_machines_record(tmp_path, monkeypatch, capsys):
    """A killed run and a live one, in a private registry: run A (dead, killed with -9) recorded the original 1;
    run B (live) started after the kill and saw 0. Cleanup during B removes A's state file and keeps
    the machine's record; with B gone, the value restored is the machine's 1, never B's 0."""
    from emulation import runstate
    from emulation.cleanup import cleanup, leftovers
    from emulation.runstate import machine_path, machine_sysctls, record_machine_sysctls

    key = "dblp.test.not_a_real_sysctl"  # no such key: nothing is written to the machine
    private = tmp_path / "private"
    monkeypatch.setattr(runstate, "STATE_DIR", tmp_path / "machine")  # the machine's registry: nothing live
    assert record_machine_sysctls({key: "1"}, private) == {key: "1"}  # run A, before it changed anything
    write_state(private / "a.json", {"run_id": "a", "pid": 0, "sysctls": {key: "1"}})  # then killed with -9
    saw = record_machine_sysctls({key: "0"}, private)  # run B starts and reads the changed 0
    assert saw == {key: "1"}
    write_state(private / "b.json", {"run_id": "b", "pid": os.getpid(), "pid_start": proc_start(os.getpid()),
                                     "sysctls": {key: "0"}})  # (as B's state file would say before the record)
    done = cleanup(verbose=True, registry=private)
    out = capsys.readouterr().out
    assert done["state_files"] == [str(private / "a.json")] and done["sysctls"] == []
    assert f"stay recorded in {machine_path(private)}" in out, out
    assert machine_sysctls(private) == {key: "1"}  # the only record of the original survives the cleanup
    (private / "b.json").unlink()  # B ends (its teardown restores the record's values and forgets it; here: a kill)
    assert leftovers(registry=private)["state_files"] == [str(machine_path(private))]
    done = cleanup(verbose=True, registry=private)
    out = capsys.readouterr().out
    assert f"restoring sysctl {key} = 1" in out and done["sysctls"] == [key], out
    assert machine_sysctls(private) == {key: "1"}  # (the key does not exist: not restored, so kept)


def test_a_scenarios_exit_says_what_the_teardown_removed(monkeypatch, capsys):
    from emulation import runstate

    monkeypatch.setattr(runstate, "_LAST_TEARDOWN", [{"removed": ["3 hosts", "1 bridge"], "left": []}])

    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        runstate.exit_main(interrupted, "microburst.py")
    assert stop.value.code == 130
    assert capsys.readouterr().err == ("\nmicroburst.py: interrupted; the emulated network was torn down "
                                       "(3 hosts, 1 bridge) (partial results stay in the run folder)\n")
    with pytest.raises(SystemExit) as stop:
        runstate.exit_main(lambda: 2, "microburst.py")
    assert stop.value.code == 2 and capsys.readouterr().err == ""
