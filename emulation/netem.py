"""Detect whether this kernel has the netem qdisc, by trying it, never by assuming.

Mininet's TCLink silently does nothing when netem is missing (the qdisc stays
``noqueue``), so link delay must be gated on a real probe. We add netem to the
loopback of a throw-away network namespace: that touches nothing shared and
works without kernel modules tools (this machine has no modprobe/lsmod).
"""

from __future__ import annotations

import functools
import os
import subprocess


@functools.lru_cache(maxsize=1)
def has_netem() -> bool:
    """True when ``tc qdisc add ... netem`` succeeds on this kernel."""
    ns = f"dblpem-netem-{os.getpid()}"
    try:
        if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode:
            return False
        rc = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root",
             "netem", "delay", "1ms"],
            capture_output=True,
        ).returncode
        return rc == 0
    except FileNotFoundError:  # no ip/tc at all
        return False
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class NetemUnavailable(RuntimeError):
    """A link asked for delay (or jitter) but the kernel has no netem."""


def main(argv: list[str] | None = None) -> int:
    """``python -m emulation.netem``: say whether this kernel has netem (exit 0 yes, 1 no)."""
    from dblp.cli.args import parser

    parser(prog="python -m emulation.netem", config=False,
           description="Probe whether this kernel has the netem qdisc (tries it on the loopback of a "
                       "throw-away network namespace; needs root). Exit status 0: available, 1: not.").parse_args(argv)
    ok = has_netem()
    print("netem available" if ok else "netem NOT available")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
