"""argparse ``type=`` factories for the plain values of every command line:
counts, bounded numbers, probabilities, integer lists, ports and host names.

Why one module: a bad value must be refused while the arguments are parsed,
before any network, namespace, process or file is made, with a message that
names the flag and the value (argparse prefixes ``argument --flag:``), and
never with a traceback. Quantities with units are :mod:`traces.units`; this
module is their unitless sibling and, like it, lives in the lowest package
(``traces``, ``dblp``, ``emulation`` and the scenarios all import it) and
imports nothing of the project.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from typing import Callable, Iterable

__all__ = [
    "MAX_PORT",
    "add_verbosity",
    "add_version",
    "log_level",
    "verbosity",
    "code_version",
    "count_arg",
    "float_arg",
    "host_arg",
    "int_arg",
    "int_list",
    "int_list_arg",
    "name_list_arg",
    "pos_int",
    "port_arg",
    "prob",
    "check_host",
    "unresolvable",
]

MAX_PORT = 65535


def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = name  # argparse says "invalid <name> value" for a ValueError
    return fn


def _bounds(lo: float | None, hi: float | None, *, lo_open: bool = False, hi_open: bool = False) -> str:
    a = "" if lo is None else f"{'(' if lo_open else '['}{lo:g}"
    b = "" if hi is None else f"{hi:g}{')' if hi_open else ']'}"
    if lo is not None and hi is not None:
        return f"in {a}, {b}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    return f"{'<' if hi_open else '<='} {hi:g}"


def _in(v: float, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (v < lo or (lo_open and v == lo)):
        return False
    if hi is not None and (v > hi or (hi_open and v == hi)):
        return False
    return True


def int_arg(lo: int | None = None, hi: int | None = None, *, what: str = "an integer") -> Callable[[str], int]:
    """``type=`` for an integer in ``[lo, hi]`` (either bound optional)."""

    def conv(text: str) -> int:
        try:
            v = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not _in(v, lo, hi, False, False):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {_bounds(lo, hi)}")
        return v

    return _named(conv, "integer")


def count_arg(lo: int = 1) -> Callable[[str], int]:
    """``type=`` for a count (workers, iterations, epochs...): an integer >= ``lo``."""
    return int_arg(lo)


def float_arg(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
              hi_open: bool = False) -> Callable[[str], float]:
    """``type=`` for a finite number in a range (open or closed at either end)."""

    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v) or not _in(v, lo, hi, lo_open, hi_open):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {_bounds(lo, hi, lo_open=lo_open, hi_open=hi_open)}")
        return v

    return _named(conv, "number")


def prob(text: str) -> float:
    """argparse type: a probability, ``0.7`` or ``70%``."""
    try:
        v = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability (use 0.7 or 70%)") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is outside [0, 1]")
    return v


def pos_int(text: str) -> int:
    """argparse type: a positive integer (``1e6`` accepted)."""
    try:
        f = float(text)
        v = int(f)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v != f:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return v


def int_list(text: str) -> list[int]:
    """argparse type: ``279,651`` -> ``[279, 651]``."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def int_list_arg(lo: int | None = 0, hi: int | None = None, *, nonempty: bool = True) -> Callable[[str], list[int]]:
    """``type=`` for a comma list of integers, each in ``[lo, hi]``."""

    def conv(text: str) -> list[int]:
        v = int_list(text)
        if nonempty and not v:
            raise argparse.ArgumentTypeError(f"{text!r} names no value")
        bad = [x for x in v if not _in(x, lo, hi, False, False)]
        if bad:
            raise argparse.ArgumentTypeError(f"{text!r}: {bad[0]} is not {_bounds(lo, hi)}")
        return v

    return _named(conv, "list")


def name_list_arg(names: Iterable[str], *, what: str = "name") -> Callable[[str], list[str]]:
    """``type=`` for a comma list of names, each one of ``names`` (refused naming the unknown one,
    as an unknown ``what``)."""
    known = list(names)

    def conv(text: str) -> list[str]:
        v = [x.strip() for x in text.split(",") if x.strip()]
        if not v:
            raise argparse.ArgumentTypeError(f"{text!r} names nothing")
        bad = [x for x in v if x not in known]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad[0]!r} (known: {', '.join(known)})")
        return v

    return _named(conv, "list")


def port_arg(*, allow_any: bool = False) -> Callable[[str], int]:
    """``type=`` for a TCP/UDP port, 1..65535 (0 too where the command means "any free port")."""
    lo = 0 if allow_any else 1

    def conv(text: str) -> int:
        try:
            v = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
        if not lo <= v <= MAX_PORT:
            raise argparse.ArgumentTypeError(f"port {text!r} is outside {lo}..{MAX_PORT}"
                                             + (" (0 = any free port)" if allow_any else ""))
        return v

    return _named(conv, "port")


_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def check_host(text: str) -> str:
    """A host name or an IPv4/IPv6 address, checked for form (not resolved: a name
    that does not resolve is refused where it is used, by name). ValueError otherwise."""
    h = text.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    try:
        ipaddress.ip_address(h)
        return h
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", h):  # all digits and dots but not an address: 999.1.1.1, 10.0.0
        raise ValueError(f"{text!r} is not an IPv4 address")
    if not h or len(h) > 253 or not all(_LABEL.fullmatch(x) for x in h.rstrip(".").split(".")):
        raise ValueError(f"{text!r} is not a host name or an IP address")
    return h


def host_arg(text: str) -> str:
    """``type=`` for a host name or address (:func:`check_host`)."""
    try:
        return check_host(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


host_arg.__name__ = "host"


def unresolvable(host: str) -> str | None:
    """Why ``host`` does not resolve (the resolver's words), or None. For the
    commands that connect out: a typo then fails at once, not after a minute of
    retrying (a server that is not up *yet* is still waited for)."""
    import socket

    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return exc.strerror or str(exc)
    except UnicodeError as exc:
        return str(exc)
    return None


# -- --version ------------------------------------------------------------------------------------
def code_version() -> str:
    """The testbed's version, with the commit (and "+modified") in a git checkout.

    Here, in the lowest package, because every entry point answers ``--version`` with it (the
    ``traces`` tools cannot import ``dblp``); :mod:`dblp.cli.provenance` records the same facts per run.
    """
    import subprocess
    from importlib import metadata
    from pathlib import Path

    try:
        version = metadata.version("dblp-testbed")
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = str(Path(__file__).resolve().parent.parent)

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return version
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return f"{version} (git {commit}{'+modified' if dirty else ''})"


class VersionAction(argparse.Action):
    """``--version``: the answer is looked up when asked (it runs git), not when the parser is built."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: object) -> None:
        kw.pop("default", None)
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        print(f"{parser.prog} {code_version()}")  # stdout, as argparse's own "version" action
        parser.exit()


def add_version(p: argparse.ArgumentParser) -> None:
    """``--version`` (every entry point has it): the testbed's version and git commit."""
    p.add_argument("--version", action=VersionAction, help="print the testbed's version (and git commit) and exit")


# -- verbosity: one vocabulary on every entry point ------------------------------------------------------
QUIET_HELP = "less output: no progress lines (warnings and errors only); not with -v"
VERBOSE_HELP = ("more output: per-round / per-iteration lines and INFO logs; -vv also DEBUG logs; not with -q "
                "(default: progress lines with an ETA where a command has them)")
PROGRESS_HELP = "deprecated alias of -v/--verbose (one line per round / iteration); kept for old launch lines"
_CONTRADICT = "-q/--quiet and -v/--verbose contradict each other: give one of them"


class QuietAction(argparse._StoreTrueAction):
    """``-q``: a store_true (a config file's ``quiet = true`` reads as before) that refuses a ``-v`` given
    before it, so that ``-q -v`` is an error with a message, not a silent last-one-wins."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        if getattr(namespace, "verbose", 0):
            parser.error(_CONTRADICT)
        super().__call__(parser, namespace, values, option_string)


class VerboseAction(argparse._CountAction):
    """``-v`` (countable: ``-vv``) and its deprecated alias ``--progress``: refuses a ``-q`` given before it."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        if getattr(namespace, "quiet", False):
            parser.error(_CONTRADICT)
        super().__call__(parser, namespace, values, option_string)


def _subcommands(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    seen: dict[int, argparse.ArgumentParser] = {}
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in a.choices.values():  # aliases (ge, gilbert-elliott) share one parser
                seen.setdefault(id(sp), sp)
    return list(seen.values())


def add_verbosity(p: argparse.ArgumentParser, *, progress_alias: bool = False, _sub: bool = False) -> None:
    """``-q/--quiet`` and ``-v/--verbose`` (countable), mapped to one level by :func:`verbosity`.

    Why one home: verbosity was ``-q`` in the scenarios, ``-v`` in ``python -m dblp`` and ``--progress`` on
    the workers. Idempotent, so that a parser built with :func:`dblp.cli.args.parser` (which adds them) can
    call it again at the end of its build: a parser with subcommands then gets them on every subcommand
    too, there with a suppressed default, so that ``-v server`` (given before the subcommand) is not
    overwritten by the subcommand's default. ``progress_alias`` adds ``--progress`` (same as ``-v``) where
    it existed, so that launch lines that pass it keep working."""
    has = "-v" in p._option_string_actions
    if not has:
        d_quiet: object = argparse.SUPPRESS if _sub else False
        d_verbose: object = argparse.SUPPRESS if _sub else 0
        p.add_argument("-q", "--quiet", action=QuietAction, default=d_quiet, help=QUIET_HELP)
        p.add_argument("-v", "--verbose", action=VerboseAction, default=d_verbose, help=VERBOSE_HELP)
    elif _sub:  # added while the subcommand was built: its defaults must not overwrite the top level's
        for a in p._actions:
            if a.dest in ("quiet", "verbose"):
                a.default = argparse.SUPPRESS
    if progress_alias and "--progress" not in p._option_string_actions:
        p.add_argument("--progress", action=VerboseAction, dest="verbose",
                       default=argparse.SUPPRESS if _sub else 0, help=PROGRESS_HELP)
    for sp in _subcommands(p):
        add_verbosity(sp, _sub=True)


def verbosity(ns: argparse.Namespace) -> int:
    """The one level of a parse: -1 quiet (no progress lines), 0 the default (progress with an ETA),
    1 verbose (per-round / per-iteration lines, INFO logs), 2+ also DEBUG logs."""
    if getattr(ns, "quiet", False):
        return -1
    return int(getattr(ns, "verbose", 0) or 0)


def log_level(ns: argparse.Namespace) -> int:
    """The :mod:`logging` level of a parse's verbosity: WARNING unless -v (INFO) or -vv (DEBUG)."""
    import logging

    v = verbosity(ns)
    return logging.DEBUG if v >= 2 else logging.INFO if v == 1 else logging.WARNING
