"""One kept connection per host: the launcher's side of ``python -m emulation.hosts keep``.

Why: on real hosts every rule switch used to be its own ``ssh host sudo nft
...`` process (a TCP and ssh handshake, then ``nft``), and bursts followed
the server's records through ``tail -F``: they switched on 21-85 ms after
the round they name had started. A :class:`KeptHost` starts the host's agent
once per policy run over the transport (one ssh session, or ``ip netns exec``)
and keeps it: a command is then one JSON line each way, ``nft`` runs inside
the agent (libnftables where it can), and the agent on the server host
relays the DBLP server's round hook, so the round hook of the Mininet
scenarios (:func:`emulation.launch.run_with_bursts`) drives the bursts on
real hosts too - the server opens round k only after the launcher switched
the bursts of round k on every host that has them.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from dblp.transport.watch import end_process_group
from .inventory import HostsError, HostSpec
from .transport import Transport


#: nice value of the threads that carry a round-hook call (launcher and agents), where allowed
URGENT_NICE = -10


def urgent() -> bool:
    """Give the calling thread (and the threads it starts later) a higher CPU priority, where this
    process may (root, or CAP_SYS_NICE); True if it did.

    Why: a round waits for its hook call, which is a few hand-overs between threads and a few
    hundred microseconds of work; on a host whose cores are busy (training workers, their data
    loaders: the 2-core test machine at load average 20) each hand-over waited for a time slice
    and a switch took up to 22 ms. Linux keeps a nice value per thread, so only these threads
    move ahead; the training processes keep theirs."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), URGENT_NICE)
        return True
    except (PermissionError, OSError, AttributeError):
        return False


class KeptHost:
    """The host's agent on one kept transport process; :meth:`cmd` runs a command there.

    ``on_rounds(first, last) -> bool`` (or ``(bool, dict)``: the dict goes into the log): with it the agent serves the DBLP server's round hook
    on the host (:attr:`hook_path`, for the server's ``--round-hook``); each call is answered
    with ``on_rounds``' result, on a thread of this object's own (it may use :meth:`cmd` of
    any kept host, this one included). Every call is logged in ``hook_log`` (JSONL):
    ``first``, ``last``, ``active``, ``t_ask`` and ``t_answered`` (the host's clock: when the
    server asked, when the answer reached the host) and ``hook_s``, their difference.
    """

    def __init__(self, tr: Transport, host: HostSpec, log: Path,
                 on_rounds: Callable[[int, int], bool | tuple[bool, dict]] | None = None,
                 hook_log: Path | None = None, start_timeout: float = 60.0) -> None:
        self.host = host
        self.on_rounds = on_rounds
        self._ids = itertools.count()
        self._pending: dict[int, tuple[threading.Event, list]] = {}
        self._write_lock = threading.Lock()
        self._events: queue.Queue = queue.Queue()
        self._asked: dict[int, dict] = {}
        self.hook_calls: list[dict] = []
        self._hook_fh = open(hook_log, "a", encoding="utf-8") if hook_log else None
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "w", encoding="utf-8")
        flags = " --round-hook" if on_rounds else ""
        script = (f"cd {shlex.quote(host.workdir)} && exec env PYTHONPATH={shlex.quote(host.workdir)} "
                  f"PYTHONUNBUFFERED=1 {shlex.quote(host.python)} -m emulation.hosts keep{flags}")
        self._log.write(f"# {host.name}: {shlex.join(tr.argv(host, script))}\n")
        self._log.flush()
        self.proc = tr.start(host, script, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self.ready: dict[str, Any] = {}
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"keep-{host.name}", daemon=True)
        self._reader.start()
        self._handler = threading.Thread(target=self._handle, name=f"keep-hook-{host.name}", daemon=True)
        self._handler.start()
        if not self._ready.wait(start_timeout) or not self.ready:
            self.close()
            raise HostsError(f"host {host.name}: the kept agent (python -m emulation.hosts keep) did not start; "
                             f"log {log}: {self._tail(log)}")

    @property
    def hook_path(self) -> str | None:
        """The Unix socket of the server's round hook on the host (None without ``on_rounds``)."""
        return self.ready.get("hook")

    @staticmethod
    def _tail(log: Path) -> str:
        try:
            return " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        except OSError:
            return ""

    # -- the two threads ---------------------------------------------------------------------
    def _read(self) -> None:
        assert self.proc.stdout is not None
        urgent()
        for raw in self.proc.stdout:
            try:
                d = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if "id" in d:
                w = self._pending.get(d["id"])
                if w is not None:
                    w[1].append(d)
                    w[0].set()
            elif d.get("ev") == "ready":
                self.ready = d
                self._log.write(f"# ready: {json.dumps(d)}\n")
                self._log.flush()
                self._ready.set()
            elif d.get("ev") in ("rounds", "answered"):
                self._events.put(d)
        self._ready.set()
        for ev, _ in list(self._pending.values()):  # the agent is gone: nobody waits forever
            ev.set()
        self._events.put(None)

    def _handle(self) -> None:
        urgent()
        while (d := self._events.get()) is not None:
            if d["ev"] == "rounds":
                active, extra = False, {}
                if self.on_rounds is not None:
                    try:
                        res = self.on_rounds(int(d["first"]), int(d["last"]))
                        active, extra = (bool(res[0]), dict(res[1])) if isinstance(res, tuple) else (bool(res), {})
                    except Exception as exc:  # noqa: BLE001 - a hook must not stall the server
                        self._log.write(f"# round hook failed at rounds {d['first']}..{d['last']}: {exc}\n")
                        self._log.flush()
                self._asked[d["seq"]] = {"first": d["first"], "last": d["last"], "active": active, "t_ask": d["t"],
                                         **extra}
                self._send({"op": "answer", "seq": d["seq"], "active": active})
            else:
                call = self._asked.pop(d["seq"], None)
                if call is not None:
                    call.update(t_answered=d["t"], hook_s=d["t"] - call["t_ask"], late=d.get("late", False))
                    self.hook_calls.append(call)
                    if self._hook_fh:
                        self._hook_fh.write(json.dumps(call) + "\n")
                        self._hook_fh.flush()

    def _send(self, d: dict) -> None:
        assert self.proc.stdin is not None
        with self._write_lock:
            try:
                self.proc.stdin.write((json.dumps(d) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise HostsError(f"host {self.host.name}: the kept agent is gone ({exc})") from None

    # -- commands ----------------------------------------------------------------------------
    def cmd(self, argv: Sequence[str], *, input: str | None = None, timeout: float = 30.0) -> dict:
        """Run ``argv`` on the host through the agent: ``{"rc", "stdout", "stderr", "t"}`` (``t``: when it
        finished, the host's clock). ``nft`` runs in the agent's process where libnftables loads."""
        i = next(self._ids)
        ev, box = threading.Event(), []
        self._pending[i] = (ev, box)
        try:
            self._send({"id": i, "op": "run", "argv": list(argv), "input": input, "timeout": timeout})
            if not ev.wait(timeout + 5) or not box:
                alive = self.proc.poll() is None
                raise HostsError(f"host {self.host.name}: {shlex.join(argv)} through the kept agent: "
                                 f"{'no answer in %g s' % (timeout + 5) if alive else 'the agent exited'}")
            return box[0]
        finally:
            self._pending.pop(i, None)

    def close(self) -> None:
        """Tell the agent to quit (it removes its hook socket), then end the transport process."""
        try:
            self._send({"op": "quit"})
            self.proc.stdin.close()  # type: ignore[union-attr]
        except (HostsError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            end_process_group(self.proc, 2.0)
        self._reader.join(timeout=5)
        self._handler.join(timeout=5)
        if self._hook_fh:
            self._hook_fh.close()
            self._hook_fh = None
        if not self._log.closed:
            self._log.close()


def hook_delays(calls: list[dict]) -> dict[str, Any]:
    """Summary of a run's round-hook calls: how long after a round was due its bursts' rules were
    in place (``rules_in_place``: ``t_rules - t_ask``, the calls that switched rules), and how long
    the round waited for the hook (``hook_s``: the answer back on the server host), for the calls
    that switched a burst on or off (``switched`` in the log) and the others."""
    import numpy as np

    def stats(xs: list[float]) -> dict[str, float] | None:
        if not xs:
            return None
        a = np.array(xs) * 1e3
        return {"n": int(a.size), "median_ms": float(np.median(a)), "max_ms": float(a.max()),
                "min_ms": float(a.min())}

    on = [c["hook_s"] for c in calls if c.get("switched")]
    off = [c["hook_s"] for c in calls if not c.get("switched")]
    rules = [c["t_rules"] - c["t_ask"] for c in calls if c.get("switched") and c.get("t_rules") is not None]
    return {"rules_in_place": stats(rules), "switching_calls": stats(on), "other_calls": stats(off),
            "late": sum(1 for c in calls if c.get("late"))}


__all__ = ["KeptHost", "hook_delays"]
