"""Tiny paced UDP sender / counting receiver, to measure loss across an emulated link.

Why not iperf3: its UDP mode reports loss per interval from the receiver side,
but we want exact counts of numbered datagrams (which ones arrived, how many
duplicates) at a pace we choose, in a few lines with no parsing of free text.

    python -m emulation.udptool recv --port 9000 --idle 1.0     # prints JSON
    python -m emulation.udptool send --dst 10.0.0.1 --port 9000 --count 2000 --pace 20M
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

from traces.argtypes import count_arg, host_arg, port_arg
from traces.units import duration_arg, rate_arg, size_arg, use_help_formatter
from traces.argtypes import add_verbosity, add_version

HDR = struct.Struct("!IQ")  # magic, sequence number
MAGIC = 0xDB1BE31


def send(dst: str, port: int, count: int, size: int, rate_mbps: float) -> dict:
    """Send ``count`` numbered datagrams of ``size`` bytes at ``rate_mbps`` (0 = unpaced)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    pad = b"\0" * max(0, size - HDR.size)
    gap = (size * 8) / (rate_mbps * 1e6) if rate_mbps > 0 else 0.0
    t0 = time.perf_counter()
    errors = 0
    for seq in range(count):
        if gap:
            wait = t0 + seq * gap - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        try:
            sock.sendto(HDR.pack(MAGIC, seq) + pad, (dst, port))
        except OSError:
            errors += 1
    return {"sent": count, "errors": errors, "elapsed_s": time.perf_counter() - t0}


def recv(port: int, idle: float, deadline: float, ready_file: str | None = None) -> dict:
    """Count distinct numbered datagrams until ``idle`` s pass without one (or ``deadline``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(("0.0.0.0", port))
    if ready_file:
        open(ready_file, "w").close()
    seen: set[int] = set()
    dup = 0
    t_end = time.monotonic() + deadline
    got_any = False
    while time.monotonic() < t_end:
        # before the first datagram wait up to the deadline; after, stop on idle
        sock.settimeout(idle if got_any else max(0.01, t_end - time.monotonic()))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            if got_any:
                break
            continue
        if len(data) >= HDR.size:
            magic, seq = HDR.unpack_from(data)
            if magic == MAGIC:
                got_any = True
                if seq in seen:
                    dup += 1
                seen.add(seq)
    return {"received": len(seen), "duplicates": dup,
            "max_seq": max(seen) if seen else -1}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m emulation.udptool", description=__doc__)
    add_version(ap)  # every entry point answers --version
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send", help="send numbered datagrams")
    s.add_argument("--dst", type=host_arg, required=True, help="destination address")
    s.add_argument("--port", type=port_arg(), required=True, help="destination UDP port")
    s.add_argument("--count", type=count_arg(1), default=2000, help="datagrams to send")
    s.add_argument("--size", type=size_arg(), default="1000", help="payload bytes")
    s.add_argument("--pace", type=rate_arg(), default="20M", help="pacing rate; a bare number is Mbit/s (0 = unpaced)")
    r = sub.add_parser("recv", help="count numbered datagrams, print JSON")
    r.add_argument("--port", type=port_arg(), required=True, help="UDP port to bind")
    r.add_argument("--idle", type=duration_arg(), default="1s", help="stop after this long without a datagram")
    r.add_argument("--deadline", type=duration_arg(), default="30s", help="stop after this long in any case")
    r.add_argument("--ready-file", help="touch this file once bound")
    add_verbosity(ap)  # -q/-v on every subcommand
    return use_help_formatter(ap)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "send":
            res = send(a.dst, a.port, a.count, a.size, a.pace / 1e6)
        else:
            res = recv(a.port, a.idle, a.deadline, a.ready_file)
    except OSError as exc:  # a busy port, an unknown host, no route
        what = f"--dst {a.dst} --port {a.port}" if a.cmd == "send" else f"--port {a.port}"
        print(f"emulation.udptool {a.cmd}: error: {what}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    json.dump(res, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
