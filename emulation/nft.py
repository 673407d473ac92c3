"""nftables drop rules and their counters: the one place that writes nft rule text and reads counters.

Every random-drop mechanism of the testbed - the Mininet loss controller
(:mod:`emulation.loss`), the trace replayer (:mod:`emulation.replay`), the
lossy loopback namespace (:mod:`emulation.lossyns`), the namespace hosts'
drop rules (:mod:`emulation.nshosts`) and the real-host launcher
(:mod:`emulation.hosts`, over ssh) - builds its scripts from these functions
and reads its counters with :func:`parse_counters`. The callers only decide
*where* a script runs (``mnexec``, ``ip netns exec``, ssh, libnftables).

The shape of every table (see :mod:`emulation.loss` for why these hooks):
one base chain per (interface, direction) on the ``netdev`` ``ingress`` /
``egress`` hook (or ``inet input`` for a loopback), holding a rule that
counts every matching packet into the *named* counter ``seen_<chain>`` and
a rule that drops ``rate`` of them (``numgen random mod M < N``) into
``drop_<chain>``. Named counters survive a chain flush, so a rate change is
one transaction (flush + add) and the counts run on across it.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

#: netdev hook priority: before anything else that might be attached
PRIORITY = -500
#: ``numgen random`` modulus of rate changes made per iteration: 0.01% steps
MOD = 10_000
#: ``numgen random`` modulus of the trace replayer: 1e-6 steps
FINE_MOD = 1_000_000
PROTOS = ("udp", "tcp", "all")


def threshold(rate: float, mod: int = MOD) -> int:
    """Loss fraction in [0, 1] -> numgen threshold out of ``mod``."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"loss rate must be in [0, 1], got {rate}")
    return round(rate * mod)


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


def script(lines: Sequence[str]) -> str:
    """Lines -> one ``nft -f -`` transaction."""
    return "\n".join(lines) + "\n"


def delete_table_args(table: str, family: str = "netdev") -> list[str]:
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
