"""The simulator's command-line vocabulary, shared by ``run``, ``sweep`` and ``calibrate``.

Why a module of its own: the three commands (and scenarios/bench_sim.py)
parse the same flags into a :class:`~dblp.sim.config.SimConfig` and take the
same baseline; with that in :mod:`dblp.sim.cli`, ``cli`` -> ``sweep`` ->
``cli`` formed an import circle. This module imports only the config and
the loss vocabulary; the commands import it.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from typing import Any

from traces.argtypes import count_arg, float_arg
from traces.units import duration_arg, fmt_duration, fmt_rate, queue_arg, rate_arg

from dblp.runs.gradients import MODEL_HELP
from dblp.protocol.policy import ALIAS_NOTE, POLICIES, policy_name, run_policy
from dblp.sim.config import SimConfig

def policy_arg(text: str) -> str:
    """``type=`` for the simulator's ``--policy``: the one name (``fixed`` -> ``baseline``), checked."""
    name = policy_name(text)
    if name not in POLICIES:
        raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(POLICIES)} ({ALIAS_NOTE})")
    return name


policy_arg.__name__ = "policy"


def _num(v: str) -> Any:
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def parse_loss(s: str) -> dict:
    """A loss spec: JSON (``{"kind": "bernoulli", "p": 0.01}``) or the shorthand
    ``kind:key=value:key=value`` with lists as ``a,b,c``, e.g.
    ``iteration_bursts:at=279,651:loss=0.7``, ``bernoulli:p=0.01``,
    ``gilbert_elliott:p=0.01:r=0.3``, ``random_bursts:rate=0.005:loss=0.7``,
    ``time_bursts:at_s=1.5:loss=0.7:duration_s=0.05``, ``trace:path=traces/samples/x.loss.csv``;
    a bare probability (``0.05`` or ``5%``) is Bernoulli loss, as ``--loss`` means in
    ``python -m traces generate bernoulli`` and ``scenarios/train.py``."""
    from traces.processes import LossSpecError, parse_spec, undeliverable  # the one spec vocabulary

    t = s.strip()
    try:
        p = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        p = None
    if p is not None:
        t = f"bernoulli:p={p!r}"
    try:
        spec = parse_spec(t)
        why = undeliverable(spec)  # e.g. bernoulli:p=1: the run would spin forever
    except LossSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if why:
        raise argparse.ArgumentTypeError(why)
    return spec


# CLI flag -> (SimConfig field, converter, help); units: traces.units (bare rates Mbit/s, durations s)
CONFIG_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--model", "model", _num, "gradient size: " + MODEL_HELP),
    ("--workers", "workers", int, "number of workers"),
    ("--iterations", "rounds", int, "iterations (rounds) to simulate"),
    ("--mtu", "mtu", int, "MTU in bytes"),
    ("--compute", "compute_s", duration_arg(), "per-iteration compute time, e.g. 50ms; a bare number is seconds"),
    ("--compute-jitter", "compute_jitter_s", duration_arg(), "std-dev of the compute time, e.g. 1ms"),
    ("--reduce", "reduce_s", duration_arg(), "server reduce time, e.g. 2ms"),
    ("--policy", "policy", policy_arg, f"tolerance policy: reliable|baseline|dblp ({ALIAS_NOTE})"),
    ("--p", "p", float, "the fixed policy's tolerance, and P_low's default"),
    ("--p-low", "p_low", float, "DBLP's tolerance in the CLR"),
    ("--p-high", "p_high", float, "DBLP's tolerance outside the CLR"),
    ("--eta", "eta", float, "CLR detection threshold"),
    ("--freq", "freq", int, "CLR check period in iterations"),
    ("--order", "order", str, "chunk send order: blocks|perm|inorder (recorded; used by the packet level)"),
    ("--norms", "norms", str, "gradient norms for CLR detection: synthetic (fixed 2.5x jumps), "
                              "varied (noisy, so eta matters: use it to sweep eta), or a CSV iteration,grad_norm"),
    ("--critical-every", "critical_every", int, "synthetic norms: a jump every N iterations"),
    ("--norm-model", "norm_model", str, "received|sequence"),
    ("--bandwidth", "bandwidth_bps", rate_arg(allow_zero=False), "worker link rate, e.g. 10G; a bare number is Mbit/s"),
    ("--server-bandwidth", "server_bandwidth_bps", rate_arg(allow_zero=False),
     "server link rate; a bare number is Mbit/s (unset: --bandwidth)"),
    ("--delay", "delay_s", duration_arg(), "one-way delay per link, e.g. 50us; a bare number is seconds"),
    ("--queue", "queue_bytes", queue_arg(), "drop-tail queue per switch port: bytes (1MiB) or packets (100pkt)"),
    ("--aggregation", "aggregation", str, "who averages: server (the paper's: --servers dedicated hosts) | sharded "
                                          "(a shard server on each worker's host, 1/workers of the tensor each)"),
    ("--servers", "servers", count_arg(1), "parameter-server hosts with --aggregation server, each averaging "
                                           "1/servers of the tensor on its own link (hosts)"),
    ("--topology", "topology", str, "network: star (the paper's) | leafspine | twosites (dblp.sim.network.topology)"),
    ("--switch-ports", "switch_ports", count_arg(1), "ports per switch; more hosts than ports are refused "
                                                    "(unset: as many as the hosts need)"),
    ("--racks", "racks", count_arg(1), "leafspine: racks of one leaf switch each; the server is in rack 1, "
                                       "workers fill racks 2, 3, ... round-robin"),
    ("--spines", "spines", count_arg(1), "leafspine: spine switches (a rack's uplinks pooled, as ECMP)"),
    ("--oversubscription", "oversubscription", float_arg(1.0),
     "leafspine: hosts per rack x --bandwidth / (spines x uplink rate), >= 1; sets the uplink rate"),
    ("--uplink-bandwidth", "uplink_bandwidth_bps", rate_arg(allow_zero=False),
     "leafspine: each leaf-spine link's rate; a bare number is Mbit/s (unset: from --oversubscription)"),
    ("--local-workers", "local_workers", count_arg(0), "twosites: workers in the server's site (the rest cross "
                                                      "the WAN)"),
    ("--wan-bandwidth", "wan_bandwidth_bps", rate_arg(allow_zero=False),
     "twosites: the WAN link's rate, e.g. 1G; a bare number is Mbit/s"),
    ("--wan-delay", "wan_delay_s", duration_arg(), "twosites: the WAN's one-way delay, e.g. 5ms; a bare number "
                                                  "is seconds"),
    ("--wan-queue", "wan_queue_bytes", queue_arg(), "twosites: drop-tail queue at each WAN end: bytes or "
                                                    "packets (100pkt) (unset: --queue)"),
    ("--wan-loss", "wan_loss", float_arg(0.0, 1.0, hi_open=True), "twosites: probability that the WAN drops a "
                                                                  "datagram (each direction)"),
    ("--send-pps", "send_pps", float, "datagrams/s a worker host can send"),
    ("--server-send-pps", "server_send_pps", float, "datagrams/s the server host can send"),
    ("--recv-cost", "recv_cost_s", duration_arg(), "a worker host's cost per broadcast datagram delivered to it, "
                                                  "e.g. 15us (charged to the sender's stream; calibrate fits it)"),
    ("--server-recv-cost", "server_recv_cost_s", duration_arg(), "the server host's cost per upload datagram "
                                                                "delivered to it, e.g. 15us"),
    ("--wake", "wake_s", duration_arg(), "sender batching: a paced sender's loop sleeps at least this long, e.g. "
                                         "2ms; the packet level then sends batches into a drop-tail host egress "
                                         "queue (0 = exact timers, smooth)"),
    ("--pace", "send_rate_bps", rate_arg(), "pacing rate of every sender, e.g. 900M; a bare number is Mbit/s "
                                           "(0 = unlimited)"),
    ("--ctrl-overhead", "ctrl_overhead_s", duration_arg(), "processing per control message, e.g. 20us"),
    ("--fidelity", "fidelity", str, "round (fast) | packet (one event per datagram) | class (one representative flow per port class, dblp.sim.engines.fabric: star or leaf-spine, 10,000 workers)"),
    ("--incast", "incast", str, "the first iteration's synchronised incast: auto (at flow level from 128 "
                                "workers on) | flow (at flow level wherever it applies) | walk (every pass "
                                "walked: the reference) (dblp.sim.engines.incast)"),
    ("--seed", "seed", int, "random seed"),
    ("--host-slice", "host_slice", int, "datagrams per peer per turn of a host's send loop"),
    ("--group", "group", int, "round level: datagrams simulated as one unit (1 = exact; 16 = ~5x faster, "
                              "<0.1%% error on mean latency, see SimConfig)"),
]


#: SimConfig field -> its flag, to name flags in the config's errors
FIELD_FLAGS: dict[str, str] = {name: flag for flag, name, _, _ in CONFIG_FLAGS} | {"elements": "--model"}


def name_flags(message: str) -> str:
    """A SimConfig error with each field named by its flag (``rounds must be ...`` ->
    ``--iterations must be ...``); a loss spec's own parameters (``loss bernoulli: p``) stay."""
    return re.sub(r"(?<![\w:-] )(?<![\w-])([a-z_]+)(?=( must|=| \())",
                  lambda m: FIELD_FLAGS.get(m.group(1), m.group(1)), message)


def _default_text(name: str) -> str:
    """SimConfig's default of a field, in the flag's units (for --help)."""
    f = {f.name: f for f in fields(SimConfig)}.get(name)
    if f is None or not isinstance(f.default, (int, float, str)) or f.default is None:
        return "unset"
    v = f.default
    if name.endswith("_bps") and isinstance(v, (int, float)):
        return fmt_rate(v)
    if name.endswith("_s") and isinstance(v, (int, float)):
        return fmt_duration(v)
    return str(v)


def add_config_args(p: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    g = p.add_argument_group("simulator parameters (override --params; defaults: dblp.sim.config.SimConfig)")
    g.add_argument("--params", default=None, help="params.json (from calibrate, or written by run --out)")
    for flag, name, conv, hlp in CONFIG_FLAGS:
        if flag not in skip:
            g.add_argument(flag, dest=name, type=conv, default=None, metavar=flag[2:].upper().replace("-", "_"),
                           help=hlp if "(unset" in hlp else f"{hlp} (default: {_default_text(name)})")
    if "--loss" not in skip:
        g.add_argument("--loss", action="append", type=parse_loss, default=None,
                       help="a loss process (repeatable), JSON or kind:key=value:..., e.g. "
                            "iteration_bursts:at=279,651:loss=0.7, or a bare probability (0.01: Bernoulli) "
                            "(replaces the params' loss list)")


def config_from_args(args: argparse.Namespace, **overrides: Any) -> SimConfig:
    base = SimConfig.from_json(args.params) if getattr(args, "params", None) else SimConfig()
    d = base.to_dict()
    names = {f.name for f in fields(SimConfig)}
    for k, v in vars(args).items():
        if k in names and v is not None:
            d[k] = v
    d.update(overrides)
    return SimConfig.from_dict(d)


def baseline_of(cfg: SimConfig) -> SimConfig:
    """The paper's baseline: a fixed tolerance p = P_low (DBLP's own parameters reset:
    they do not act on a fixed policy, and equal baselines then compare equal)."""
    return cfg.with_(**run_policy("baseline", cfg.baseline_p).config())
