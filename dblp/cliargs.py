"""The one flag vocabulary of every command (``python -m dblp ...``, ``python -m
dblp.sim ...``, the scenarios, the emulation tools): shared flag groups and the
list of names each concept goes by.

Why: the same thing had different names and units across commands (``--bw``
500 = Mbit/s beside ``--bandwidth`` 500 = bit/s; ``--rounds``/``--iterations``;
``--compute-ms 5``/``--compute 50ms``; ``--quiet``/``-q``/``--no-progress``).
Each concept now has one flag, one unit (:mod:`traces.units`; bare rates are
Mbit/s, bare durations seconds, bare sizes bytes or elements), and the groups
below add it the same way everywhere. :data:`VOCABULARY` lists, for each
concept, the one name and the names it must not go by, :data:`MEANINGS` the
one meaning of a name; ``tests/test_cli_vocabulary.py`` walks every command's
parser against both.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from traces.units import HelpFormatter, duration_arg, queue_arg, rate_arg

from .gradients import MODEL_HELP, model_elements
from .policy import DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_K, DEFAULT_P_LOW, POLICIES, RUNS, parse_runs
from .wire import ParameterError

__all__ = [
    "MEANINGS",
    "UNIT_SUFFIXES",
    "VOCABULARY",
    "HelpFormatter",
    "add_burst_args",
    "add_policy_args",
    "add_quiet",
    "add_run_args",
    "check_burst_args",
    "check_run_args",
    "hostport",
    "pace_rate",
    "parser",
]

#: concept -> (the one flag, flags that must not name it in any command).
#: ``--out`` is the folder a run's files go into; ``--results`` the parent folder
#: under which a run makes its own timestamped folder.
VOCABULARY: dict[str, tuple[str, tuple[str, ...]]] = {
    "link bandwidth (rate; bare number = Mbit/s)": ("--bandwidth", ("--bw", "--link-rate", "--rate")),
    "sender pacing rate (rate; bare number = Mbit/s)": ("--pace", ("--rate", "--rate-mbps", "--send-rate")),
    "drop-tail queue (bytes, or <n>pkt)": ("--queue", ("--buffer", "--queue-bytes", "--buffer-bytes")),
    "iterations (rounds) to run": ("--iterations", ("--rounds",)),
    "per-iteration compute time (duration)": ("--compute", ("--compute-ms",)),
    "gradient size: a model name or an element count": ("--model", ("--elements", "--size-elements")),
    "no progress lines": ("--quiet", ("--no-progress", "--silent")),
    "folder of this run's files": ("--out", ("--output-dir", "--outdir")),
    "parent folder of the run folder": ("--results", ("--results-root",)),
    "no plot": ("--no-plot", ("--no-png",)),
    "pause between rounds (duration)": ("--gap", ("--gap-ms",)),
    "a file this command writes": ("--output", ("--out-file", "--output-file")),
    "a Gilbert-Elliott transition probability": ("--good-to-bad", ("--r",)),
    "number of ranks of a collective": ("--world-size", ("--world",)),
}
#: a unit belongs in the value (``--compute 5ms``), never in the flag's name (``--compute-ms 5``)
UNIT_SUFFIXES: tuple[str, ...] = ("-ms", "-us", "-ns", "-s", "-sec", "-seconds", "-mbps", "-gbps", "-bps", "-bytes",
                                  "-pkts", "-kb", "-mb")

#: flag -> a word its help must contain wherever it appears: one meaning per name.
MEANINGS: dict[str, str] = {
    "--p": "tolerance",  # never a Gilbert-Elliott probability (--good-to-bad)
    "--results": "parent",  # the parent folder; --out is the folder itself
    "--out": "folder",
    "--output": "file",
    "--json": "print",  # print JSON instead of text; a file to write is --output
    "--iterations": "iteration",
    "--bandwidth": "Mbit/s",
    "--pace": "Mbit/s",
    "--queue": "queue",
    "--compute": "compute",
    "--model": "size",
    "--loss": "loss",
}


def hostport(s: str) -> tuple[str, int]:
    """``type=`` for ``--server HOST:PORT``."""
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {s!r}")
    return host, int(port)


def parser(prog: str | None = None, description: str | None = None, **kw: Any) -> argparse.ArgumentParser:
    """An ArgumentParser with the shared :class:`~traces.units.HelpFormatter` (defaults shown)."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter, **kw)


def add_quiet(p: argparse.ArgumentParser | Any, what: str = "progress lines") -> None:
    p.add_argument("-q", "--quiet", action="store_true", help=f"no {what}")


def add_policy_args(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """The server's tolerance policy (``python -m dblp server``; the simulator
    takes the same flags with ``defaults=False``: None = the params file's)."""
    d = (lambda v: v) if defaults else (lambda v: None)
    g = p.add_argument_group("tolerance policy")
    g.add_argument("--policy", choices=list(POLICIES), default=d("dblp"), help="tolerance policy")
    g.add_argument("--p", type=float, default=d(DEFAULT_P_LOW),
                   help="the fixed policy's tolerance, and P_low's default")
    g.add_argument("--p-low", type=float, default=None, help="DBLP's tolerance in the CLR (default: --p)")
    g.add_argument("--p-high", type=float, default=None,
                   help=f"DBLP's tolerance outside the CLR (default: P_low + {DEFAULT_K})")
    g.add_argument("--eta", type=float, default=d(DEFAULT_ETA), help="CLR detection threshold")
    g.add_argument("--freq", type=int, default=d(DEFAULT_FREQ), help="CLR check period in iterations")


def add_run_args(ap: argparse.ArgumentParser, *, iterations: int, policies: str, results: Path) -> None:
    """Flags every emulation scenario shares: gradient size, runs, tolerances, links, processes."""
    ap.add_argument("--model", default="1e6", help="gradient size: " + MODEL_HELP)
    ap.add_argument("--iterations", type=int, default=iterations, help="iterations (rounds) of each run")
    ap.add_argument("--policies", default=policies, help=f"runs to make, in order ({', '.join(RUNS)})")
    ap.add_argument("--p-low", type=float, default=DEFAULT_P_LOW, help="baseline p and DBLP's P_low")
    ap.add_argument("--p-high", type=float, default=None, help=f"DBLP's P_high (default P_low + {DEFAULT_K})")
    ap.add_argument("--eta", type=float, default=DEFAULT_ETA, help="CLR detection threshold")
    ap.add_argument("--freq", type=int, default=DEFAULT_FREQ, help="CLR check period in iterations")
    ap.add_argument("--workers", type=int, default=3, help="number of workers")
    ap.add_argument("--bandwidth", type=rate_arg(allow_zero=False), default="500M",
                    help="link rate (TBF) of every link; a bare number is Mbit/s")
    ap.add_argument("--queue", type=queue_arg(), default="100pkt",
                    help="drop-tail queue (TBF limit) of every link end: bytes (150kB) or full-size packets (100pkt)")
    ap.add_argument("--pace-share", type=float, default=0.9,
                    help="senders pace at this fraction of their share of the server link (0 = unpaced)")
    ap.add_argument("--compute", type=duration_arg(), default="5ms",
                    help="per-iteration compute time of the workers; a bare number is seconds")
    ap.add_argument("--gso", action="store_true",
                    help="use UDP GSO/GRO (off in emulation: a drop rule would drop 44-datagram super-packets)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of every process")
    ap.add_argument("--results", default=str(results), help="parent folder of the run folder")
    add_quiet(ap, "per-iteration progress")


def check_run_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Validate :func:`add_run_args`'s flags (errors name the flag) and derive the rest:
    ``policy_list``, ``elements``, ``p_high``, ``bw_mbps`` (what topologies take) and
    ``queue_bytes`` (the name a calibration looks for in the run's config.json)."""
    try:
        a.policy_list = parse_runs(a.policies)
    except ParameterError as exc:
        ap.error(f"--policies: {exc}")
    if a.iterations < 2:
        ap.error("--iterations must be at least 2")
    if a.workers < 1:
        ap.error("--workers must be at least 1")
    try:
        a.elements = model_elements(a.model)
    except ValueError as exc:
        ap.error(f"--model: {exc}")
    if a.p_high is None:
        a.p_high = a.p_low + DEFAULT_K
    a.bw_mbps = a.bandwidth / 1e6
    a.queue_bytes = a.queue


def add_burst_args(ap: argparse.ArgumentParser, *, bursts: str = "50,110") -> None:
    """Iteration bursts of the microburst experiments (paper V-B)."""
    ap.add_argument("--bursts", default=bursts, help="iterations hit by a burst (comma list)")
    ap.add_argument("--burst-loss", type=float, default=0.7, help="loss fraction during a burst")
    ap.add_argument("--burst-kind", choices=["drop", "congestion"], default="drop",
                    help="drop: nftables random drop of UDP; congestion: iperf3 UDP cross-traffic into the bottleneck")


def check_burst_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Validate :func:`add_burst_args` (after :func:`check_run_args`); derives ``bursts_list``."""
    try:
        a.bursts_list = [int(x) for x in a.bursts.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--bursts: expected a comma list of iterations, got {a.bursts!r}")
    if any(not 0 <= b < a.iterations for b in a.bursts_list):
        ap.error(f"--bursts must lie in [0, {a.iterations})")
    if not 0 <= a.burst_loss <= 1:
        ap.error(f"--burst-loss must be in [0, 1], got {a.burst_loss}")


def pace_rate(a: argparse.Namespace) -> float:
    """Each sender's pacing rate in bit/s from ``--pace-share`` (0 = unpaced): that
    fraction of a worker's share of the server link."""
    return a.pace_share * a.bandwidth / a.workers if a.pace_share > 0 else 0.0
