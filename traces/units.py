"""Units of every command line and configuration file: bit rates, sizes, durations.

One parser per kind of quantity, one meaning per suffix, wherever a rate, a
size or a duration is read (flags of every command, host inventories, link
shapes, tc/netem descriptions). It lives in ``traces``, the lowest package,
because the trace importers read tc rates too; nothing here imports anything
of the project.

Rates (:func:`parse_rate`, result in bit/s), following tc(8) because every
rate ends in a tc command or comes from one:

* ``500M``, ``10G``, ``1.5k``: a bare prefix means *bits* per second;
* ``500mbit``, ``500Mbit/s``, ``1gbit``: bits per second;
* ``125mbps``, ``1Gbps``: refused on a command line or in a config file, naming both readings:
  tc reads ``bps`` as **bytes** per second (125mbps = 1 Gbit/s), most network tools and papers as
  bits; a silent guess would be wrong for one of them (``--bandwidth 500Mbps`` was 4 Gbit/s).
  What reads tc's own text (``tc``/netem descriptions, ``tc=True``) keeps tc's bytes;
* prefixes ``k M G T`` are powers of 1000, ``Ki Mi Gi Ti`` powers of 1024;
  case does not matter (``m`` is mega, never milli);
* a bare number is in the flag's documented unit (``default_unit``; the
  command-line flags use Mbit/s, so ``--bandwidth 500`` is 500 Mbit/s).

Sizes (:func:`parse_size`, result an integer count of bytes or of elements):
``k M G T`` = 1000**n, ``Ki Mi Gi Ti`` = 1024**n (SI and IEC: ``25M`` elements
is 25,000,000, ``1MiB`` is 1,048,576 bytes); an optional ``B`` after the
prefix says bytes (``150kB``); ``1e6`` is a plain number. tc's own size
syntax (``k`` = 1024) is *not* followed: no rule of this project reads a tc
size.

Queues (:func:`parse_queue`, result in bytes): a size, or a packet count
with ``pkt`` (``100pkt``): packets are full-MTU Ethernet frames of
:data:`FRAME_BYTES`, the unit Mininet's TBF limit has always been given in. A
``--queue`` flag (:func:`queue_arg`) refuses a bare number: tc and Mininet read one
as packets, so it says which (``100pkt`` or ``100B``).

Durations (:func:`parse_duration`, result in seconds): ``ns us µs ms s min h``;
a bare number is in ``default_unit`` (seconds unless a flag documents otherwise).

``*_arg`` return argparse ``type=`` callables whose errors name the value and
what is accepted; argparse adds the flag (``argument --bandwidth: ...``).
:class:`HelpFormatter` shows every flag's default in ``--help``.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable

__all__ = [
    "FRAME_BYTES",
    "HelpFormatter",
    "UnitError",
    "duration_arg",
    "fmt_duration",
    "fmt_rate",
    "fmt_size",
    "parse_duration",
    "parse_queue",
    "parse_rate",
    "parse_size",
    "queue_arg",
    "rate_arg",
    "size_arg",
    "use_help_formatter",
]

#: Bytes a full-MTU Ethernet frame occupies in a qdisc (1500 IP + 14 Ethernet):
#: what one packet of a queue given in packets (``100pkt``) is worth.
FRAME_BYTES = 1514


class UnitError(ValueError):
    """A quantity that does not parse or lies outside what its flag allows."""


_PREFIX = {
    "": 1.0,
    "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
    "ki": 1024.0, "mi": 1024.0**2, "gi": 1024.0**3, "ti": 1024.0**4,
}
_RATE_UNIT = {"bit": 1.0, "bits": 1.0, "bit/s": 1.0, "bps": 8.0}  # tc: bps = BYTES per second
_DURATION = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0}
_NUM = re.compile(r"\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([^\s0-9].*?)?\s*")

RATE_UNITS: dict[str, float] = {p + u: m * f for p, m in _PREFIX.items() for u, f in _RATE_UNIT.items()}
RATE_UNITS.update({p: m for p, m in _PREFIX.items() if p})  # a bare prefix: bits
SIZE_UNITS: dict[str, float] = {p + b: m for p, m in _PREFIX.items() for b in ("", "b")}


def _split(text: str | float | int, what: str) -> tuple[float, str]:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text), ""
    m = _NUM.fullmatch(str(text))
    if not m:
        raise UnitError(f"{what} {text!r} is not a number with an optional unit")
    return float(m.group(1)), (m.group(2) or "").lower()


def _check(v: float, text: object, what: str, *, allow_zero: bool) -> float:
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise UnitError(f"{what} {text!r} must be {'non-negative' if allow_zero else 'positive'}")
    return v


def parse_rate(text: str | float, default_unit: str = "bit", *, allow_zero: bool = True, tc: bool = False) -> float:
    """A bit rate in bit/s; a bare number (or a float) is in ``default_unit``
    (a key of :data:`RATE_UNITS`, e.g. ``"Mbit"``). ``tc``: the text is tc's (``bps`` = bytes per
    second); otherwise a ``bps`` unit is refused with both of its readings (see the module)."""
    v, unit = _split(text, "rate")
    unit = unit or default_unit.lower()
    if unit not in RATE_UNITS:
        raise UnitError(f"rate {text!r}: unknown unit {unit!r} (use e.g. 500M, 500mbit, 10G)")
    if unit.endswith("bps") and not tc:
        prefix = unit[:-3]
        as_bits, as_bytes = fmt_rate(v * RATE_UNITS[prefix or "bit"] if prefix else v), fmt_rate(v * RATE_UNITS[unit])
        raise UnitError(f"rate {text!r} is ambiguous: {unit!r} is bits per second to most tools ({as_bits}) but "
                        f"bytes per second to tc ({as_bytes}); write {v:g}{prefix}bit for {as_bits}")
    return _check(v * RATE_UNITS[unit], text, "rate", allow_zero=allow_zero)


def parse_size(text: str | int | float, default_unit: str = "", *, allow_zero: bool = False) -> int:
    """A count of bytes or elements; ``k`` = 1000, ``Ki`` = 1024 (see the module)."""
    v, unit = _split(text, "size")
    unit = unit or default_unit.lower()
    if unit not in SIZE_UNITS:
        raise UnitError(f"size {text!r}: unknown unit {unit!r} (use e.g. 25M, 5e6, 150kB, 1MiB)")
    n = _check(v * SIZE_UNITS[unit], text, "size", allow_zero=allow_zero)
    if abs(n - round(n)) > 1e-9 * max(1.0, n):
        raise UnitError(f"size {text!r} is not a whole number")
    return int(round(n))


def parse_queue(text: str | int, default_unit: str = "b", *, bare: bool = True) -> int:
    """A drop-tail queue in bytes: a size (bare number = bytes) or ``<n>pkt``
    packets of :data:`FRAME_BYTES`. ``bare=False`` refuses a bare number: Mininet's
    ``max_queue_size`` and every tc user read one as packets, so a flag that took it as
    bytes made ``--queue 100`` a 100-byte queue without a word."""
    v, unit = _split(text, "queue")
    if unit in ("pkt", "pkts", "packets"):
        return int(_check(v, text, "queue", allow_zero=False)) * FRAME_BYTES
    if not unit and not bare:
        raise UnitError(f"queue {text!r}: a bare number is ambiguous (tc and Mininet read packets); give "
                        f"{str(text).strip()}pkt (packets of {FRAME_BYTES} bytes) or {str(text).strip()}B (bytes)")
    return parse_size(text, default_unit)


def parse_duration(text: str | float, default_unit: str = "s", *, allow_zero: bool = True) -> float:
    """A duration in seconds; a bare number (or a float) is in ``default_unit``."""
    v, unit = _split(text, "duration")
    unit = unit or default_unit.lower()
    if unit not in _DURATION:
        raise UnitError(f"duration {text!r}: unknown unit {unit!r} (use e.g. 50us, 5ms, 0.2s, 2min)")
    return _check(v * _DURATION[unit], text, "duration", allow_zero=allow_zero)


# -- printing ------------------------------------------------------------------------------
def _fmt(v: float, units: tuple[tuple[str, float], ...], base: str) -> str:
    for name, d in units:
        if abs(v) >= d:
            return f"{v / d:g} {name}"
    return f"{v:g} {base}"


def fmt_rate(bps: float) -> str:
    """``5e8`` -> ``'500 Mbit/s'`` (0 -> ``'unlimited'``)."""
    if bps == 0:
        return "unlimited"
    return _fmt(bps, (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)), "bit/s")


def fmt_size(n: int) -> str:
    """``25_000_000`` -> ``'25M'``, ``200_000`` -> ``'200K'``; what :func:`parse_size` reads back
    (case does not matter to it; results folders have always been named with ``K``)."""
    for unit, d in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= d and n % (d // 1000) == 0:
            return f"{n / d:g}{unit}"
    return str(n)


def fmt_duration(s: float) -> str:
    """``0.05`` -> ``'50 ms'``."""
    return _fmt(s, (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)), "ns") if s else "0 s"


# -- argparse -------------------------------------------------------------------------------
def _arg(fn: Callable, name: str, **kw) -> Callable[[str], float]:
    def conv(text: str):
        try:
            return fn(text, **kw)
        except UnitError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    conv.__name__ = name  # argparse names it in "invalid <name> value"
    return conv


def rate_arg(default_unit: str = "Mbit", *, allow_zero: bool = True) -> Callable[[str], float]:
    """``type=`` for a rate flag: bit/s, bare numbers in ``default_unit`` (Mbit/s for every flag)."""
    return _arg(parse_rate, "rate", default_unit=default_unit, allow_zero=allow_zero)


def size_arg(default_unit: str = "", *, allow_zero: bool = False) -> Callable[[str], int]:
    """``type=`` for a size flag (elements or bytes)."""
    return _arg(parse_size, "size", default_unit=default_unit, allow_zero=allow_zero)


def queue_arg() -> Callable[[str], int]:
    """``type=`` for ``--queue``: bytes with a unit (150kB, 1000000B), or ``<n>pkt``; a bare number is refused."""
    return _arg(parse_queue, "queue", bare=False)


def duration_arg(default_unit: str = "s", *, allow_zero: bool = True) -> Callable[[str], float]:
    """``type=`` for a duration flag: seconds, bare numbers in ``default_unit``."""
    return _arg(parse_duration, "duration", default_unit=default_unit, allow_zero=allow_zero)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every command's formatter: keeps the description's layout and appends
    ``(default: X)`` to each option's help unless the help already says its
    default (``(default...``), the default is None/False, or the flag is a switch."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        if (
            h
            and "%(default)" not in h
            and "(default" not in h.lower()
            and action.default is not None
            and action.default is not False
            and action.default != argparse.SUPPRESS
            and action.option_strings
            and action.nargs != 0
        ):
            h += " (default: %(default)s)"
        return h


def use_help_formatter(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give ``p`` and every subcommand's parser :class:`HelpFormatter`; returns ``p``."""
    p.formatter_class = HelpFormatter
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in set(a.choices.values()):
                use_help_formatter(sp)
    return p
