"""nftables drop rules and their counters: the one place that writes nft rule text and reads counters.

Every random-drop mechanism of the testbed - the Mininet loss controller
(:mod:`emulation.loss`), the trace replayer (:mod:`emulation.replay`), the
lossy loopback namespace (:mod:`emulation.lossyns`), the namespace hosts'
drop rules (:mod:`emulation.nshosts`) and the real-host launcher
(:mod:`emulation.hosts`, over ssh) - builds its scripts from these functions
and reads its counters with :func:`parse_counters`. The callers decide
*where* a script runs (``mnexec``, ``ip netns exec``, ssh, libnftables); the
runners at the end (:func:`make_backend`: the ``nft`` command, or libnftables
loaded into this process and entering the host's namespace per call) run a
script in a host's namespace for those that run many of them, such as the
trace replayer and the real-host agent.

The shape of every table (see :mod:`emulation.loss` for why these hooks):
one base chain per (interface, direction) on the ``netdev`` ``ingress`` /
``egress`` hook (or ``inet input`` for a loopback), holding a rule that
counts every matching packet into the *named* counter ``seen_<chain>`` and
a rule that drops ``rate`` of them (``numgen random mod M < N``) into
``drop_<chain>``. Named counters survive a chain flush, so a rate change is
one transaction (flush + add) and the counts run on across it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import re
import threading
from typing import Sequence

import numpy as np

from .sysutil import run

#: netdev hook priority: before anything else that might be attached
PRIORITY = -500
#: ``numgen random`` modulus of rate changes made per iteration: 0.01% steps
MOD = 10_000
#: ``numgen random`` modulus of the trace replayer: 1e-6 steps
FINE_MOD = 1_000_000
#: ``numgen inc`` modulus of a packet trace played once: the counter never wraps within a run
INC_MOD_ONCE = 0xFFFFFFFF
PROTOS = ("udp", "tcp", "all")


def threshold(rate: float, mod: int = MOD) -> int:
    """Loss fraction in [0, 1] -> numgen threshold out of ``mod``."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"loss rate must be in [0, 1], got {rate}")
    return round(rate * mod)


def applied_rate(rate: float, mod: int = MOD) -> float:
    """The loss a ``numgen random mod {mod}`` rule for ``rate`` really applies: its threshold over ``mod``.
    No range check here, so that a level a hair above 1 from averaging (a resampled trace) rounds to 1
    instead of failing; :func:`threshold` checks the rounded rate when the rule is written."""
    return round(float(rate) * mod) / mod


def match(proto: str = "udp", dports: tuple[int, int] | None = None) -> str:
    """The match expression of a target's packets: ``udp`` (optionally a destination port
    range), ``tcp``, or ``all`` (every IPv4/IPv6 packet; ARP is never matched)."""
    if proto not in PROTOS:
        raise ValueError(f"proto must be one of {', '.join(PROTOS)}, not {proto!r}")
    if dports and proto != "udp":
        raise ValueError("dports only applies to proto='udp'")
    if proto == "all":
        return "meta protocol { ip, ip6 }"
    if dports:
        lo, hi = dports
        return f"udp dport {lo}" if lo == hi else f"udp dport {lo}-{hi}"
    return f"meta l4proto {proto}"


def chain_name(direction: str, dev: str, proto: str = "udp", dports: tuple[int, int] | None = None) -> str:
    """A chain name unique per (direction, interface, packets), e.g. ``ingress_srv_eth0_udp``."""
    ports = f"_{dports[0]}_{dports[1]}" if dports else ""
    return re.sub(r"[^A-Za-z0-9_]", "_", f"{direction}_{dev}_{proto}{ports}")


def chain_lines(table: str, chain: str, hook: str, dev: str | None = None, *, family: str = "netdev",
                priority: int = PRIORITY) -> list[str]:
    """Create the table (if absent), the chain's two named counters and the base chain."""
    device = f' device "{dev}"' if dev else ""
    return [f"add table {family} {table}",
            f"add counter {family} {table} seen_{chain}",
            f"add counter {family} {table} drop_{chain}",
            f"add chain {family} {table} {chain} {{ type filter hook {hook}{device} priority {priority}; "
            f"policy accept; }}"]


def drop_lines(table: str, chain: str, what: str, rate: float, *, family: str = "netdev",
               mod: int = MOD) -> list[str]:
    """Replace the chain's rules: count every ``what`` packet, drop ``rate`` of them (0: none)."""
    n = threshold(rate, mod)
    lines = [f"flush chain {family} {table} {chain}",
             f'add rule {family} {table} {chain} {what} counter name "seen_{chain}"']
    if n >= mod:  # numgen's threshold must stay below the modulus: total loss drops outright
        lines.append(f'add rule {family} {table} {chain} {what} counter name "drop_{chain}" drop')
    elif n > 0:
        lines.append(f'add rule {family} {table} {chain} {what} numgen random mod {mod} < {n} '
                     f'counter name "drop_{chain}" drop')
    return lines


def packet_drop_lines(table: str, chain: str, what: str, elements: Sequence[str], mod: int, *,
                      family: str = "netdev", per_line: int = 2000) -> list[str]:
    """Exact per-packet verdicts: ``numgen inc`` numbers the chain's packets and a set holds
    the indices to drop (``elements``: ``"k"`` or ``"a-b"``)."""
    lines = [f"add set {family} {table} drops_{chain} {{ typeof numgen inc mod 2; flags interval; }}"]
    for i in range(0, len(elements), per_line):
        lines.append(f"add element {family} {table} drops_{chain} {{ {', '.join(elements[i:i + per_line])} }}")
    lines.append(f'add rule {family} {table} {chain} {what} counter name "seen_{chain}"')
    if elements:
        lines.append(f'add rule {family} {table} {chain} {what} numgen inc mod {mod} @drops_{chain} '
                     f'counter name "drop_{chain}" drop')
    return lines


def trace_drop_lines(table: str, chain: str, what: str, drops: np.ndarray, loop: bool) -> list[str]:
    """:func:`packet_drop_lines` of a packet trace's verdicts (``drops[k]``: the k-th matching packet is
    dropped): the counter wraps at the trace's length when it ``loop``-s, else never within a run
    (past the end every packet is delivered)."""
    n = int(np.size(drops))
    if n > INC_MOD_ONCE:
        raise ValueError(f"packet trace too long for numgen ({n} packets)")
    return packet_drop_lines(table, chain, what, interval_elements(drops), n if loop else INC_MOD_ONCE)


def interval_elements(drops: np.ndarray) -> list[str]:
    """Indices of True values as nft set elements (:func:`packet_drop_lines`), runs as ``a-b``."""
    idx = np.flatnonzero(drops)
    if idx.size == 0:
        return []
    brk = np.flatnonzero(np.diff(idx) != 1)
    starts = np.concatenate(([idx[0]], idx[brk + 1]))
    ends = np.concatenate((idx[brk], [idx[-1]]))
    return [str(s) if s == e else f"{s}-{e}" for s, e in zip(starts.tolist(), ends.tolist())]


# ----------------------------------------------------------------------------- replayer


def script(lines: Sequence[str]) -> str:
    """Lines -> one ``nft -f -`` transaction."""
    return "\n".join(lines) + "\n"


def delete_table_lines(table: str, family: str = "netdev") -> list[str]:
    """The statement that removes a table with its chains, sets and counters (for a script runner)."""
    return [f"delete table {family} {table}"]


def delete_table_args(table: str, family: str = "netdev") -> list[str]:
    """The same as an ``nft`` command line (for a host's command runner)."""
    return ["nft", "delete", "table", family, table]


def list_counters_args(table: str, family: str = "netdev") -> list[str]:
    return ["nft", "-j", "list", "counters", "table", family, table]


def parse_counters(text: str) -> dict[str, dict]:
    """``nft -j list counters`` output -> name -> {packets, bytes} ({} for no table/garbage)."""
    try:
        items = json.loads(text).get("nftables", []) if text.strip() else []
    except json.JSONDecodeError:
        return {}
    return {c["name"]: {"packets": c.get("packets", 0), "bytes": c.get("bytes", 0)}
            for c in (i.get("counter") for i in items) if c}


def chain_counters(raw: dict[str, dict], chain: str) -> dict[str, int]:
    """The seen/dropped counts of one chain from :func:`parse_counters`' result."""
    seen, drop = raw.get(f"seen_{chain}", {}), raw.get(f"drop_{chain}", {})
    return {"seen_packets": seen.get("packets", 0), "seen_bytes": seen.get("bytes", 0),
            "dropped_packets": drop.get("packets", 0), "dropped_bytes": drop.get("bytes", 0)}


def dropped_total(raw: dict[str, dict]) -> int:
    """Packets dropped by every chain of a table."""
    return sum(int(c.get("packets", 0)) for name, c in raw.items() if name.startswith("drop_"))


# -- running a script in a host's namespace: the nft command, or libnftables in this process --------
class NftBackend:
    """Runs an nft script in a host's network namespace (host given by its PID)."""

    name = "?"

    def run(self, pid: int | None, script: str) -> None:
        raise NotImplementedError

    def open_thread(self) -> None:
        """Called on the thread that will call ``run`` before its first call."""

    def close(self) -> None:
        """Release everything (called on the same thread as ``run``)."""


class CliNftBackend(NftBackend):
    """``mnexec -a PID nft -f -``: a process per call (~15-30 ms on a busy machine)."""

    name = "nft"

    def run(self, pid: int | None, script: str) -> None:
        run(["nft", "-f", "-"], pid=pid, input=script)


def _libnftables() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("nftables") or "libnftables.so.1")
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    return lib


def have_libnftables() -> bool:
    """Whether libnftables and ``setns`` can be used from this process."""
    try:
        _libnftables()
        return hasattr(ctypes.CDLL(None), "setns") and os.path.exists("/proc/thread-self/ns/net")
    except OSError:
        return False


class LibNftBackend(NftBackend):
    """libnftables in this process; each call enters the host's netns on the calling thread.

    ``setns(CLONE_NEWNET)`` moves only the calling thread, so this must run on
    a thread of its own (never the main thread): it enters the host's
    namespace, runs one transaction (~0.05 ms) and goes back to the thread's
    own namespace before returning, so subprocesses it starts later and the
    rest of the process stay in the root namespace. Contexts (their netlink
    sockets hold the namespace) and namespace fds are released by ``close()``.
    """

    name = "libnftables"
    CLONE_NEWNET = 0x40000000

    def __init__(self) -> None:
        self.lib = _libnftables()
        self.libc = ctypes.CDLL(None, use_errno=True)
        self._home: int | None = None
        self._ns: dict[int, int] = {}  # host pid -> netns fd
        self._ctx: dict[int | None, int] = {}  # host pid -> nft_ctx*
        self._thread: int | None = None

    def open_thread(self) -> None:
        if threading.current_thread() is threading.main_thread():
            raise RuntimeError("LibNftBackend must run on its own thread (setns moves the caller)")
        self._thread = threading.get_ident()
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    def _setns(self, fd: int) -> None:
        if self.libc.setns(fd, self.CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns: {os.strerror(err)}")

    #: ``nft_ctx_output_set_flags``: JSON output (``nft -j``)
    OUTPUT_JSON = 1 << 4

    def run(self, pid: int | None, script: str) -> None:
        self.output(pid, script)

    def output(self, pid: int | None, script: str, json_out: bool = False) -> str:
        """Run ``script`` (one transaction, or a command such as ``list counters ...``) and return
        what nft printed (JSON with ``json_out``, as ``nft -j``); raises on failure."""
        if self._home is None or threading.get_ident() != self._thread:
            raise RuntimeError("LibNftBackend.run called off its thread (call open_thread first)")
        if pid is not None and pid not in self._ns:
            self._ns[pid] = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if pid is not None:
            self._setns(self._ns[pid])
        try:
            ctx = self._ctx.get(pid)
            if ctx is None:  # made inside the namespace: its socket belongs there
                ctx = self.lib.nft_ctx_new(0)
                if not ctx:
                    raise OSError("nft_ctx_new failed")
                self.lib.nft_ctx_buffer_output(ctx)
                self.lib.nft_ctx_buffer_error(ctx)
                self._ctx[pid] = ctx
            self.lib.nft_ctx_output_set_flags(ctx, self.OUTPUT_JSON if json_out else 0)
            rc = self.lib.nft_run_cmd_from_buffer(ctx, script.encode())
            out = (self.lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
            if rc != 0:
                err = (self.lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
                raise RuntimeError(f"nft (libnftables) failed: {err.strip()}\nscript:\n{script[:2000]}")
            return out
        finally:
            if pid is not None:
                self._setns(self._home)

    def close(self) -> None:
        for pid, ctx in list(self._ctx.items()):
            if pid is not None and pid in self._ns:
                try:
                    self._setns(self._ns[pid])  # free the context where it was made
                except OSError:
                    pass
            try:
                self.lib.nft_ctx_free(ctx)
            finally:
                if pid is not None and self._home is not None:
                    self._setns(self._home)
        self._ctx.clear()
        for fd in self._ns.values():
            os.close(fd)
        self._ns.clear()
        if self._home is not None:
            os.close(self._home)
            self._home = None


def make_backend(kind: str = "auto") -> NftBackend:
    """``auto`` (libnftables when loadable, else the nft command), ``libnftables`` or ``nft``."""
    if kind == "nft":
        return CliNftBackend()
    if kind == "libnftables" or (kind == "auto" and have_libnftables()):
        return LibNftBackend()
    if kind != "auto":
        raise ValueError(f"unknown backend {kind!r} (auto, libnftables, nft)")
    return CliNftBackend()
