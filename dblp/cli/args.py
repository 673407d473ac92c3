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
import sys
from pathlib import Path
from typing import Any

import re

from traces.argtypes import (add_verbosity, add_version, check_host, count_arg, float_arg, int_arg, int_list_arg,
                             log_level, verbosity)
from traces.processes import undeliverable
from traces.units import HelpFormatter, duration_arg, queue_arg, rate_arg

from dblp.protocol.compensation import (add_compensation_args, add_configs_arg, check_compensation_args,  # noqa: F401
                           check_configs_arg)  # (re-exported: the flags' one vocabulary)
from dblp.cli.configfile import CONFIG_NOT_FLAGS, ConfigArgumentParser, add_config_flags  # noqa: F401  (re-exported)
from dblp.runs.gradients import MODEL_HELP, model_elements
from dblp.protocol.policy import (ALIAS_NOTE, DEFAULT_ETA, DEFAULT_FREQ, DEFAULT_K, DEFAULT_P_LOW, POLICIES, RUNS, PolicySpec,
                     check_tolerance, policy_name,
                     default_p_high, parse_runs, run_policy)
from dblp.protocol.wire import AUTO_MTU, DEFAULT_MTU, MAX_MTU, MIN_MTU, ParameterError

__all__ = [
    "MEANINGS",
    "UNIT_SUFFIXES",
    "VOCABULARY",
    "HelpFormatter",
    "add_burst_args",
    "add_hosts_arg",
    "HOST_KINDS",
    "DEVICES",
    "add_policy_args",
    "add_quiet",
    "add_verbosity",
    "log_level",
    "verbosity",
    "add_run_args",
    "add_seeds_arg",
    "add_target_args",
    "parse_targets",
    "add_workload_args",
    "check_workload_args",
    "check_burst_args",
    "check_policy_args",
    "check_run_args",
    "policy_error",
    "tolerance_arg",
    "hostport",
    "hostport_any",
    "hostports",
    "add_auth_args",
    "server_secret",
    "worker_secret",
    "listen_arg",
    "model_arg",
    "mtu_arg",
    "link_mtu_arg",
    "MTU_HELP",
    "pace_rate",
    "pace_arg",
    "pace_share_arg",
    "PACE_HELP",
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
    "more output: per-round lines, INFO logs (countable)": ("--verbose", ("--debug", "--loud")),
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
    "--quiet": "no progress lines",
    "--verbose": "per-round",
}


def hostport(s: str) -> tuple[str, int]:
    """``type=`` for ``--server HOST:PORT`` (host checked for form, port 1..65535)."""
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {s!r}")
    if not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} of {s!r} is outside 1..65535")
    try:
        return check_host(host), int(port)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{s!r}: {exc}") from None


def hostport_any(s: str) -> tuple[str, int]:
    """``type=`` for a HOST:PORT to listen on or reach, port 0 allowed (any free one)."""
    host, _, port = s.rpartition(":")
    if port != "0":
        return hostport(s)
    try:
        return check_host(host), 0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{s!r}: {exc}") from None


def hostports(s: str) -> list[tuple[str, int]]:
    """``type=`` for ``--server HOST:PORT[,HOST:PORT...]`` (several: the shard servers, shard 0 first)."""
    out = [hostport(x.strip()) for x in s.split(",")]
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"{s!r} names a server twice")
    return out


LOCAL_SHARD_HELP = ("sharded mode: the shard whose server runs on this host, whose share then moves "
                    "through shared memory, not the network (dblp.transport.hostlocal): auto (the server at one of "
                    "this host's addresses), off (the network for every shard), or its index")


def add_local_shard_arg(p: argparse.ArgumentParser | Any) -> None:
    """``--local-shard`` of the workers that take ``--server`` lists (dblp worker, dblp.train worker)."""
    p.add_argument("--local-shard", type=local_shard_arg, default="auto", metavar="auto|off|J",
                   help=LOCAL_SHARD_HELP)


def local_shard_arg(text: str) -> int | str | None:
    """``type=`` for ``--local-shard``: "auto", "off" (None) or a shard index."""
    if text in ("auto", "off"):
        return None if text == "off" else text
    try:
        j = int(text)
    except ValueError:
        j = -1
    if j < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: auto, off or a shard index (0, 1, ...)")
    return j


def tolerance_arg(text: str) -> float:
    """``type=`` for a loss tolerance: :func:`dblp.protocol.policy.check_tolerance`'s rule, [0, 1)."""
    try:
        return check_tolerance("tolerance", float(text))
    except (ValueError, ParameterError):
        raise argparse.ArgumentTypeError(f"{text!r}: a tolerance must be a number in [0, 1)") from None


tolerance_arg.__name__ = "tolerance"
#: the policy fields' flags, for naming them in errors (dblp.protocol.policy names the fields)
POLICY_FLAGS: dict[str, str] = {"p_low": "--p-low", "p_high": "--p-high", "eta": "--eta", "freq": "--freq",
                                "p": "--p"}
_ETA = float_arg(0.0)
_FREQ = count_arg(1)


def policy_error(exc: Exception) -> str:
    """A policy's ParameterError with its field names replaced by their flags."""
    return re.sub(r"\b(p_low|p_high|eta|freq|p)\b", lambda m: POLICY_FLAGS[m.group(1)], str(exc))


def check_policy_args(ap: argparse.ArgumentParser, a: argparse.Namespace, runs: list[str]) -> list[PolicySpec]:
    """Build every named run's :class:`~dblp.protocol.policy.PolicySpec` from ``--p-low``,
    ``--p-high``, ``--eta``, ``--freq`` (the policy objects' own checks: P_high >= P_low,
    P_low + k < 1...) and refuse a bad combination by flag, before anything starts."""
    try:
        return [run_policy(r, a.p_low, a.p_high, a.eta, a.freq) for r in runs]
    except ParameterError as exc:
        ap.error(policy_error(exc) + (f" (--p-high defaults to --p-low + {DEFAULT_K})" if a.p_high is None else ""))
    raise AssertionError  # ap.error exits


def parser(prog: str | None = None, description: str | None = None, *, config: bool = True,
           **kw: Any) -> argparse.ArgumentParser:
    """An ArgumentParser with the shared :class:`~traces.units.HelpFormatter` (defaults shown),
    ``--version`` and, with ``config``, ``--config FILE`` and ``--print-config``
    (:class:`ConfigArgumentParser`)."""
    ap = ConfigArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter, **kw)
    add_version(ap)
    add_verbosity(ap)  # a parser with subcommands calls add_verbosity(ap) again once they are added
    if config:
        add_config_flags(ap)
    return ap


def add_auth_args(p: argparse.ArgumentParser | Any, role: str) -> None:
    """``--secret-file`` and ``--insecure`` (:mod:`dblp.protocol.auth`): how a server or worker proves it belongs to the run."""
    made = (" (made, mode 0600, when it does not exist; without this flag or $DBLP_SECRET the server makes a "
            "secret and prints where it wrote it)") if role == "server" else ""
    p.add_argument("--secret-file", default=None, metavar="FILE",
                   help="the run's shared secret, 64 hex digits readable by its owner only" + made +
                        "; default: $DBLP_SECRET")
    p.add_argument("--insecure", action="store_true",
                   help="the paper's unauthenticated wire: no challenge-response, CRC-only datagrams "
                        "(every process of the run must say it)")


def server_secret(args: argparse.Namespace, env: dict | None = None) -> tuple[bytes | None, str]:
    """The server's secret from its flags, and a line saying where it is (for the user and the workers).

    ``--secret-file`` that does not exist yet, or neither it nor ``$DBLP_SECRET``: a new secret,
    written 0600 (a fresh private folder when no file was named)."""
    import os
    import tempfile

    from dblp.protocol import auth

    if args.insecure:
        return None, "unauthenticated (--insecure)"
    environ = os.environ if env is None else env
    if args.secret_file and os.path.lexists(args.secret_file):  # a dangling link too: refused there, by name
        return auth.read_secret_file(args.secret_file), f"secret from {args.secret_file}"
    if not args.secret_file and environ.get(auth.SECRET_ENV):
        return auth.parse_secret(environ[auth.SECRET_ENV], f"${auth.SECRET_ENV}"), f"secret from ${auth.SECRET_ENV}"
    path = args.secret_file or os.path.join(tempfile.mkdtemp(prefix="dblp-"), "secret")
    text = auth.new_secret()
    auth.write_secret_file(path, text)
    return bytes.fromhex(text), f"new secret in {path} (give the workers --secret-file {path})"


def worker_secret(args: argparse.Namespace) -> bytes | None:
    """A worker's secret from ``--secret-file`` or ``$DBLP_SECRET`` (None with ``--insecure``)."""
    from dblp.protocol import auth

    return auth.resolve_secret(args.secret_file, args.insecure)


def interface_address(name: str) -> str | None:
    """The IPv4 address of the network interface ``name`` (None when there is no such interface)."""
    import fcntl
    import socket
    import struct

    try:
        if name not in {n for _, n in socket.if_nameindex()}:
            return None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", name.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
    except OSError:
        return None


def listen_arg(s: str) -> str:
    """``type=`` for a server's ``--host``: an address, a host name, or an interface's name (its IPv4 address)."""
    addr = interface_address(s)
    if addr is not None:
        return addr
    return check_host(s)


def add_quiet(p: argparse.ArgumentParser | Any, what: str = "progress lines") -> None:
    """Kept for callers of the older helper: the same as :func:`add_verbosity` (``-q`` and ``-v``;
    ``what`` is no longer used: the flags mean the same on every command)."""
    add_verbosity(p)


def add_policy_args(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    """The server's tolerance policy (``python -m dblp server``; the simulator
    takes the same flags with ``defaults=False``: None = the params file's)."""
    d = (lambda v: v) if defaults else (lambda v: None)
    g = p.add_argument_group("tolerance policy")
    g.add_argument("--policy", type=policy_name, choices=list(POLICIES), default=d("dblp"),
                   help=f"tolerance policy ({ALIAS_NOTE})")
    g.add_argument("--p", type=tolerance_arg, default=d(DEFAULT_P_LOW),
                   help="the baseline's fixed tolerance, and P_low's default")
    g.add_argument("--p-low", type=tolerance_arg, default=None, help="DBLP's tolerance in the CLR (default: --p)")
    g.add_argument("--p-high", type=tolerance_arg, default=None,
                   help=f"DBLP's tolerance outside the CLR (default: P_low + {DEFAULT_K})")
    g.add_argument("--eta", type=_ETA, default=d(DEFAULT_ETA), help="CLR detection threshold")
    g.add_argument("--freq", type=_FREQ, default=d(DEFAULT_FREQ), help="CLR check period in iterations")


def add_run_args(ap: argparse.ArgumentParser, *, iterations: int, policies: str, results: Path) -> None:
    """Flags every emulation scenario shares: gradient size, runs, tolerances, links, processes."""
    ap.add_argument("--model", default="1e6", help="gradient size: " + MODEL_HELP)
    ap.add_argument("--iterations", type=count_arg(2), default=iterations, help="iterations (rounds) of each run")
    ap.add_argument("--policies", default=policies, help=f"runs to make, in order ({', '.join(RUNS)})")
    ap.add_argument("--p-low", type=tolerance_arg, default=DEFAULT_P_LOW, help="baseline p and DBLP's P_low")
    ap.add_argument("--p-high", type=tolerance_arg, default=None, help=f"DBLP's P_high (default P_low + {DEFAULT_K})")
    ap.add_argument("--eta", type=_ETA, default=DEFAULT_ETA, help="CLR detection threshold")
    ap.add_argument("--freq", type=_FREQ, default=DEFAULT_FREQ, help="CLR check period in iterations")
    ap.add_argument("--workers", type=count_arg(1), default=3, help="number of workers")
    ap.add_argument("--bandwidth", type=rate_arg(allow_zero=False), default="500M",
                    help="link rate (TBF) of every link; a bare number is Mbit/s")
    ap.add_argument("--queue", type=queue_arg(), default="100pkt",
                    help="drop-tail queue (TBF limit) of every link end: bytes (150kB) or full-size packets (100pkt)")
    ap.add_argument("--pace-share", type=pace_share_arg,
                    default="auto" if SCENARIO_PACE_SHARE is None else str(SCENARIO_PACE_SHARE),
                    help="sender pacing: auto, every sender paces itself from what its passes delivered and "
                         "the server's one rate a round (dblp.protocol.pacing, core rules R11, R12, R14; docs/pacing.md), "
                         "as the transport's own commands do; or an override: a fraction of a sender's fair "
                         "share of the server link, which the scenario knows from its own topology (0.9: the "
                         "hand-set pacing the scenarios used before; 0 = unpaced)")
    ap.add_argument("--compute", type=duration_arg(), default="5ms",
                    help="per-iteration compute time of the workers; a bare number is seconds")
    ap.add_argument("--gso", action="store_true",
                    help="use UDP GSO/GRO; the links are then segmented so loss rules still drop single "
                         "datagrams (emulation.loss.segment_links)")
    ap.add_argument("--mtu", type=link_mtu_arg, default=1500,
                    help=f"MTU of every link and of the transport, in bytes ({MIN_MTU}-{MAX_MTU}; 9000: jumbo "
                         "frames, a sixth of the datagrams per gradient)")
    ap.add_argument("--seed", type=int_arg(0), default=0, help="random seed of every process")
    ap.add_argument("--insecure", action="store_true",
                    help="the paper's unauthenticated CRC-only wire (default: authenticated, a fresh secret per "
                         "run handed to every process in $DBLP_SECRET)")
    ap.add_argument("--aggregation", choices=["server", "sharded"], default="server",
                    help="server: the paper's parameter server on srv; sharded: a shard server on every worker "
                         "host (beyond the paper, dblp.transport.shard), bursts then on every worker's incoming link")
    ap.add_argument("--results", default=str(results), help="parent folder of the run folder")
    ap.add_argument("--out", default=None,
                    help="folder of this run's files (default: a new timestamped folder under --results)")
    add_quiet(ap, "per-iteration progress")


def folder_problem(path: str | Path) -> str | None:
    """Why a run could not make (or write into) the folder ``path``; None when it can. The nearest
    part of the path that exists decides: a file there is in the way, a folder must be writable."""
    import os

    probe = Path(path)
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def check_run_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Validate :func:`add_run_args`'s flags (errors name the flag) and derive the rest:
    ``policy_list``, ``elements``, ``p_high``, ``bw_mbps`` (what topologies take) and
    ``queue_bytes`` (the name a calibration looks for in the run's config.json)."""
    try:
        a.policy_list = parse_runs(a.policies)
    except ParameterError as exc:
        ap.error(f"--policies: {exc}")
    try:
        a.elements = model_elements(a.model)
    except ValueError as exc:
        ap.error(f"--model: {exc}")
    check_policy_args(ap, a, a.policy_list)
    if a.p_high is None:  # what run_policy defaults it to
        a.p_high = default_p_high(a.p_low)
    a.bw_mbps = a.bandwidth / 1e6
    try:  # a --config file's value skips argparse's type=: the same rule, applied here
        a.mtu = link_mtu_arg(str(a.mtu))
    except argparse.ArgumentTypeError as exc:
        ap.error(f"argument --mtu: {exc}")
    a.queue_bytes = a.queue
    for flag in ("results", "out"):  # a dry run says so too, not only the run that fails making it
        why = folder_problem(getattr(a, flag)) if getattr(a, flag, None) else None
        if why:
            ap.error(f"argument --{flag}: {getattr(a, flag)}: {why}")
    if getattr(a, "out", None) and Path(a.out, "config.json").exists():
        ap.error(f"argument --out: {a.out} already holds a run (config.json); name another folder")
    if getattr(a, "aggregation", "server") == "sharded" and a.workers < 2:
        ap.error(f"--aggregation sharded: needs at least 2 workers (--workers {a.workers})")


def add_burst_args(ap: argparse.ArgumentParser, *, bursts: str = "50,110") -> None:
    """Iteration bursts of the microburst experiments (paper V-B)."""
    ap.add_argument("--bursts", default=bursts, help="iterations hit by a burst (comma list, or 'none')")
    ap.add_argument("--burst-loss", type=float_arg(0.0, 1.0), default=0.7, help="loss fraction during a burst")
    ap.add_argument("--burst-kind", choices=["drop", "congestion"], default="drop",
                    help="drop: nftables random drop of UDP; congestion: iperf3 UDP cross-traffic into the bottleneck")


def check_burst_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Validate :func:`add_burst_args` (after :func:`check_run_args`); derives ``bursts_list``."""
    if a.bursts.strip().lower() == "none":  # the no-burst rows of Table V
        a.bursts_list = []
        return
    try:
        a.bursts_list = int_list_arg(0, a.iterations - 1, nonempty=False)(a.bursts)
    except argparse.ArgumentTypeError as exc:
        if a.bursts == ap.get_default("bursts"):  # not on the command line: name the flag that was
            ap.error(f"argument --iterations: the bursts at {a.bursts} (--bursts' default, not given) do not "
                     f"fit a run of {a.iterations} iterations; give --bursts within 0..{a.iterations - 1}, "
                     f"or --bursts none")
        ap.error(f"argument --bursts: {exc} (iterations of a run of --iterations {a.iterations})")
    if a.burst_kind == "drop":  # an iteration that loses everything never ends (traces.processes)
        why = undeliverable({"kind": "iteration_bursts", "at": a.bursts_list, "loss": a.burst_loss})
        if why:
            ap.error(f"argument --burst-loss: {a.burst_loss:g}: {why}")


#: the values of the emulation scenarios' ``--hosts`` (resolved by :func:`emulation.hostnet.resolve_hosts`)
HOST_KINDS: tuple[str, ...] = ("auto", "mininet", "netns")
#: the values of the scenarios' ``--device`` for training workers
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


def add_hosts_arg(ap: argparse.ArgumentParser) -> None:
    """``--hosts``: how an emulation scenario makes its hosts (one emulation layer, two host makers)."""
    ap.add_argument("--hosts", choices=list(HOST_KINDS), default="auto",
                    help="the emulated hosts: mininet (Mininet hosts), netns (plain network namespaces on a bridge "
                         "in a namespace of its own: no Mininet needed), auto (mininet where `import mininet` works "
                         "and mnexec is on PATH, else netns); the choice is printed and recorded in config.json")


def add_workload_args(ap: argparse.ArgumentParser, *, default: str | None) -> None:
    """Real training workers in the emulated hosts (``--workload``), or a replayed gradient."""
    ap.add_argument("--workload", default=default if default is not None else "none",
                    help="train this dblp.train workload in the worker hosts (digits_mlp: ~1M parameters on the "
                         "bundled digits; mnist1d_cnn: a 110k-parameter 1-D CNN on MNIST-1D, generated offline, "
                         "~1,000 iterations before its accuracy plateaus; small_cnn, small_transformer; "
                         "efficientnet_b0, resnet50, alexnet, gpt2_s "
                         "with --data-root or --data teacher), or 'none' to replay a synthetic gradient of --model's size")
    ap.add_argument("--data-root", default=None,
                    help="folder of the paper workloads' data sets (default: $DBLP_DATA_ROOT)")
    ap.add_argument("--data", choices=["real", "teacher"], default="real",
                    help="the training data: real (the workload's data set) or teacher (efficientnet_b0, resnet50, "
                         "alexnet: a learnable synthetic image set of CIFAR's shape, labels from a fixed random "
                         "teacher network; nothing read from disk; its limits are printed)")
    ap.add_argument("--data-size", type=count_arg(1), default=None,
                    help="--data teacher: training images, a count (default 35,712: 93 iterations per epoch of "
                         "3 workers at batch 128)")
    ap.add_argument("--device", choices=list(DEVICES), default="auto",
                    help="where the training workers compute: auto (cuda when this machine has a GPU, else cpu), "
                         "cpu or cuda (all workers of a host share its first GPU)")
    ap.add_argument("--no-weights", action="store_true",
                    help="do not snapshot the workers' weights per epoch (no replica divergence table)")
    add_target_args(ap)


def add_target_args(ap: argparse.ArgumentParser) -> None:
    """``--eval-every`` and ``--target-accuracy``: the time-to-accuracy flags of every training scenario."""
    ap.add_argument("--eval-every", type=eval_every_arg, default="auto", metavar="auto|epoch|N",
                    help="test every N iterations for the time-to-accuracy curve (auto: a quarter of an epoch; "
                         "epoch: at epoch ends only); the clock excludes evaluation time")
    ap.add_argument("--target-accuracy", default=None, metavar="T[,T...]",
                    help="targets of time to accuracy (comma list): accuracies as fractions (default 0.9,0.94), "
                         "or perplexities for a perplexity workload (reached at or below; default none)")


def eval_every_arg(text: str) -> int | str:
    """``type=`` for ``--eval-every``: "auto", "epoch" (0) or a count of iterations >= 1."""
    if text in ("auto", "epoch"):
        return text if text == "auto" else 0
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: auto, epoch or a number of iterations >= 1")
    return n


eval_every_arg.__name__ = "eval-every"

#: the default targets of time to accuracy, per metric (a perplexity has none: it depends on the data)
DEFAULT_TARGETS: dict[str, tuple[float, ...]] = {"accuracy": (0.9, 0.94), "perplexity": ()}


def parse_targets(text: str | None, metric: str) -> list[float]:
    """``--target-accuracy``: accuracies in (0, 1) or perplexities > 1, by the workload's ``metric``;
    raises ValueError naming what is wrong."""
    if text is None:
        return list(DEFAULT_TARGETS.get(metric, ()))
    out = []
    for part in (x.strip() for x in text.split(",")):
        try:
            v = float(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a number") from None
        if metric == "accuracy" and not 0.0 < v < 1.0:
            hint = f" (a percentage? write {v / 100:g})" if 1.0 < v <= 100.0 else ""
            raise ValueError(f"{part}: an accuracy target is a fraction in (0, 1){hint}")
        if metric == "perplexity" and not (v > 1.0 and v < float("inf")):
            raise ValueError(f"{part}: a perplexity target is a number > 1")
        out.append(v)
    if len(set(out)) != len(out):
        raise ValueError(f"{text!r} names a target twice")
    return sorted(out, reverse=metric == "perplexity")  # the easiest target first


def add_seeds_arg(ap: argparse.ArgumentParser, default: int = 1) -> None:
    """``--seeds N``: replicates of every run (seeds --seed .. --seed+N-1, interleaved across the runs)."""
    ap.add_argument("--seeds", type=count_arg(1), default=default,
                    help="replicates of every run, seeds --seed..--seed+N-1, interleaved (seed s of every policy "
                         "back to back, so machine drift hits all alike); N >= 2 adds medians with 95%% intervals")


def check_workload_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Validate ``--workload`` before anything starts (unknown name, missing data set) and
    derive ``train`` (None for a replayed gradient): the workload's gradient size becomes
    ``elements``, and ``--iterations`` is rounded up to whole epochs of a worker's shard."""
    a.train = None
    if a.device not in DEVICES:  # a --config value skips argparse's choices
        ap.error(f"argument --device {a.device!r}: one of {', '.join(DEVICES)}")
    if a.data not in ("real", "teacher"):
        ap.error(f"argument --data {a.data!r}: one of real, teacher")
    if a.workload == "none":
        if a.data != "real" or a.data_size is not None or a.device != "auto":
            ap.error("--data, --data-size and --device are for training workers: give --workload")
        return
    if a.data_size is not None and a.data != "teacher":
        ap.error(f"argument --data-size: only with --data teacher (--data {a.data} reads the data set as it is)")
    try:
        import torch

        from dblp.train import get_workload
        from dblp.train.data import DatasetMissingError
    except ImportError as exc:
        ap.error(f"--workload {a.workload}: training needs the [train] extra ({exc})")
    cuda = torch.cuda.is_available()
    if a.device == "cuda" and not cuda:
        ap.error("argument --device: cuda, but torch sees no CUDA device on this machine (use auto or cpu)")
    device = ("cuda" if cuda else "cpu") if a.device == "auto" else a.device
    try:
        wl = get_workload(a.workload, a.data_root, seed=a.seed, data=a.data, data_size=a.data_size)
    except (KeyError, ValueError, ImportError, DatasetMissingError) as exc:
        ap.error(f"--workload {a.workload}: {exc.args[0] if isinstance(exc, KeyError) else exc}")
    batch = int(wl.defaults.get("batch_size", 32))
    per_epoch = (len(wl.train_set) // a.workers) // batch
    if per_epoch < 1:
        ap.error(f"--workload {a.workload}: a worker's shard ({len(wl.train_set) // a.workers} samples of "
                 f"{len(wl.train_set)} over {a.workers} workers) is smaller than one batch of {batch}")
    epochs = -(-a.iterations // per_epoch)
    if epochs * per_epoch != a.iterations:  # said, not silent; config.json keeps the flag and, under derived, this
        print(f"--iterations {a.iterations} -> {epochs * per_epoch}: training runs whole epochs "
              f"({epochs} of {per_epoch} iterations)", file=sys.stderr)
    a.iterations = epochs * per_epoch
    a.elements = sum(p.numel() for p in wl.model.parameters() if p.requires_grad)
    try:
        targets = parse_targets(getattr(a, "target_accuracy", None), wl.metric)
    except ValueError as exc:
        ap.error(f"argument --target-accuracy: {exc} (--workload {wl.name} reports {wl.metric})")
    every = getattr(a, "eval_every", 0)
    every = max(1, per_epoch // 4) if every == "auto" else int(every)
    a.train = {"workload": wl.name, "epochs": epochs, "iterations_per_epoch": per_epoch, "batch_size": batch,
               "metric": wl.metric, "data_root": a.data_root, "save_weights": not a.no_weights,
               "data": a.data, "data_size": len(wl.train_set) if a.data == "teacher" else None,
               "data_limits": wl.info.get("data_limits"), "device": device, "eval_every": every, "targets": targets}


def check_scenario_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The checks of the flag groups a scenario's parser has (:func:`add_run_args`, and :func:`add_workload_args`
    and :func:`add_burst_args` where it added them), in the one order that works: the workload's check rounds
    ``--iterations`` up to whole epochs, and the bursts must lie within the iterations that then run."""
    check_run_args(ap, a)
    if hasattr(a, "workload"):
        check_workload_args(ap, a)
    if hasattr(a, "bursts"):
        check_burst_args(ap, a)


# The scenarios' default --pace-share: ``auto`` (None), every sender paces itself (R11, R12, R14), as
# the transport's own commands do; a number is the override (a fraction of a sender's fair share of the
# server link, which the scenario knows from its own topology). It was 0.9 while DBLP's accuracy looked
# lower self-paced (three seed-0 runs); in replicates over five seeds, alternating blocks, it was not
# (docs/pacing.md, the accuracy gap of self-paced runs), after R12 learnt a high tolerance's loss.
SCENARIO_PACE_SHARE: float | None = None


def pace_rate(a: argparse.Namespace) -> float | None:
    """Each sender's pacing rate in bit/s from ``--pace-share``: None (``auto``) = self-pacing,
    0 = unpaced, else that fraction of a worker's share of the server link (the scenarios' default)."""
    share = getattr(a, "pace_share", None)
    if share is None:
        return None
    return share * a.bandwidth / a.workers if share > 0 else 0.0


PACE_HELP = ("sender pacing: auto (the default: each sender sets its own rate from what its passes "
             "delivered, dblp.protocol.pacing.AutoPacer), 0 (unlimited) or a rate, e.g. 900M; a bare number is Mbit/s")

MTU_HELP = (f"link MTU in bytes ({MIN_MTU}-{MAX_MTU}), which sets the chunk size (a datagram fills it), or auto: "
            "the MTU of the link holding the server's --host address, as TCP sizes segments from its MSS "
            "(capped where larger datagrams lose UDP GSO's batching, dblp.transport.udp.AUTO_MTU_CAP); a wildcard "
            f"--host (0.0.0.0, ::) cannot know its workers' paths and gets {DEFAULT_MTU}")


def pace_arg(text: str) -> float | None:
    """``type=`` for ``--pace``: ``auto`` -> None (self-pacing), else a rate in bit/s (0 = unlimited)."""
    if text.strip().lower() == "auto":
        return None
    return rate_arg()(text)


pace_arg.__name__ = "pace"


def pace_share_arg(text: str) -> float | None:
    """``type=`` for ``--pace-share``: ``auto`` -> None (self-pacing), else a fraction >= 0 (0 = unpaced)."""
    if text.strip().lower() == "auto":
        return None
    return float_arg(0.0)(text)


pace_share_arg.__name__ = "pace share"


def mtu_arg(text: str) -> int | str:
    """``type=`` for a server's or loopback run's ``--mtu``: ``auto`` (the path's MTU,
    :func:`dblp.transport.udp.auto_mtu`, resolved where the bind address is known) or the range
    :class:`dblp.protocol.wire.ChunkLayout` accepts."""
    if text.strip().lower() == AUTO_MTU:
        return AUTO_MTU
    try:
        int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or auto") from None
    return link_mtu_arg(text)


def link_mtu_arg(text: str) -> int:
    """``type=`` for a link's ``--mtu`` (the emulation's links, which set it, not read it): a number of
    bytes in [:data:`dblp.protocol.wire.MIN_MTU`, :data:`dblp.protocol.wire.MAX_MTU`], as every ``--mtu`` help says.
    Why not :class:`dblp.protocol.wire.ChunkLayout`'s own floor (56 bytes: one value a datagram, which the
    tests' tiny layouts use): every IPv4 host takes 576-byte datagrams, and a 100-byte MTU given by
    mistake would cut a 25M gradient into a million datagrams instead of being refused."""
    try:
        mtu = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of bytes (a link's MTU is set, not read: auto is for the transport's own "
            f"--mtu of dblp server/loopback)" if text.strip().lower() == AUTO_MTU else
            f"{text!r} is not a number of bytes") from None
    if not MIN_MTU <= mtu <= MAX_MTU:
        raise argparse.ArgumentTypeError(f"{text!r}: a link's MTU is {MIN_MTU}-{MAX_MTU} bytes") from None
    return mtu


link_mtu_arg.__name__ = "mtu"
mtu_arg.__name__ = "mtu"


def model_arg(text: str) -> str:
    """``type=`` for ``--model``: a model name or an element count (:func:`dblp.runs.gradients.model_elements`);
    returns the text as given (commands record it)."""
    try:
        model_elements(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


model_arg.__name__ = "model"

