"""``python -m dblp.sim run | sweep | calibrate``.

``run`` simulates one configuration (optionally beside its baseline) and
writes the round records (JSONL, the schema of :mod:`dblp.records`), a
summary (JSON) and plots (latency per iteration, CDF); ``sweep`` runs a grid
in parallel (see :mod:`dblp.sim.sweep`); ``calibrate`` turns an emulation
run's results folder into ``params.json`` (see :mod:`dblp.sim.calibrate`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..wire import ParameterError
from .config import SimConfig

_MULT = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_rate(s: str) -> float:
    """'10G' -> 1e10 bit/s, '100M' -> 1e8, '0' -> 0."""
    t = s.strip().lower().removesuffix("bit/s").removesuffix("bps").removesuffix("bit")
    try:
        return float(t[:-1]) * _MULT[t[-1]] if t and t[-1] in _MULT else float(t)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"bad rate {s!r}: use e.g. 10G, 100M, 2.5e9") from None


def parse_time(s: str) -> float:
    """'50us' -> 5e-5 s, '1ms' -> 1e-3, '0.2' -> 0.2 (seconds)."""
    t = s.strip().lower()
    for suf, m in (("us", 1e-6), ("ms", 1e-3), ("ns", 1e-9), ("s", 1.0)):
        if t.endswith(suf):
            try:
                return float(t[: -len(suf)]) * m
            except ValueError:
                break
    try:
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad time {s!r}: use e.g. 50us, 1ms, 0.2") from None


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
    ``time_bursts:at_s=1.5:loss=0.7:duration_s=0.05``, ``trace:path=traces/samples/x.loss.csv``."""
    s = s.strip()
    if s.startswith("{"):
        try:
            d = json.loads(s)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"bad loss JSON {s!r}: {exc}") from None
    else:
        kind, *parts = s.split(":")
        d = {"kind": kind}
        for part in parts:
            if "=" not in part:
                raise argparse.ArgumentTypeError(f"bad loss spec part {part!r} in {s!r}: expected key=value")
            k, v = part.split("=", 1)
            if "," in v or k in ("at", "at_s"):
                vals = [_num(x) for x in v.split(",") if x]
                d[k] = vals
            else:
                d[k] = _num(v)
    from .loss import check_spec

    try:
        check_spec(d)
    except ParameterError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return d


# CLI flag -> (SimConfig field, converter, help)
CONFIG_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--model", "model", _num, "resnet50|efficientnetb0|alexnet|gpt2s or an element count"),
    ("--workers", "workers", int, "number of workers"),
    ("--rounds", "rounds", int, "iterations to simulate"),
    ("--mtu", "mtu", int, "MTU in bytes"),
    ("--compute", "compute_s", parse_time, "per-iteration compute time, e.g. 50ms"),
    ("--compute-jitter", "compute_jitter_s", parse_time, "std-dev of the compute time"),
    ("--reduce", "reduce_s", parse_time, "server reduce time"),
    ("--policy", "policy", str, "reliable|fixed|dblp"),
    ("--p", "p", float, "fixed tolerance, and P_low's default"),
    ("--p-low", "p_low", float, "DBLP's tolerance in the CLR"),
    ("--p-high", "p_high", float, "DBLP's tolerance outside the CLR"),
    ("--eta", "eta", float, "CLR detection threshold"),
    ("--freq", "freq", int, "CLR check period (iterations)"),
    ("--order", "order", str, "blocks|perm|inorder (recorded; used by the packet level)"),
    ("--norms", "norms", str, "gradient norms for CLR detection: synthetic (default, fixed 2.5x jumps), "
                              "varied (noisy, so eta matters: use it to sweep eta), or a CSV iteration,grad_norm"),
    ("--critical-every", "critical_every", int, "synthetic norms: a jump every N iterations"),
    ("--norm-model", "norm_model", str, "received|sequence"),
    ("--bandwidth", "bandwidth_bps", parse_rate, "worker link rate, e.g. 10G"),
    ("--server-bandwidth", "server_bandwidth_bps", parse_rate, "server link rate (default: --bandwidth)"),
    ("--delay", "delay_s", parse_time, "one-way delay per link, e.g. 50us"),
    ("--queue-bytes", "queue_bytes", int, "drop-tail buffer per switch port (bytes)"),
    ("--send-pps", "send_pps", float, "datagrams/s a worker host can send"),
    ("--server-send-pps", "server_send_pps", float, "datagrams/s the server host can send"),
    ("--rate", "send_rate_bps", parse_rate, "pacing rate of every sender (0 = unlimited)"),
    ("--ctrl-overhead", "ctrl_overhead_s", parse_time, "processing per control message"),
    ("--fidelity", "fidelity", str, "round (fast) | packet (one event per datagram)"),
    ("--seed", "seed", int, "random seed"),
    ("--host-slice", "host_slice", int, "datagrams per peer per turn of a host's send loop"),
    ("--group", "group", int, "round level: datagrams simulated as one unit (1 = exact; 16 = ~5x faster, "
                              "<0.1%% error on mean latency, see SimConfig)"),
]


def add_config_args(p: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    g = p.add_argument_group("simulator parameters (override --params; defaults: dblp.sim.config.SimConfig)")
    g.add_argument("--params", default=None, help="params.json (from calibrate, or written by run --out)")
    for flag, name, conv, hlp in CONFIG_FLAGS:
        if flag not in skip:
            g.add_argument(flag, dest=name, type=conv, default=None, help=hlp)
    if "--loss" not in skip:
        g.add_argument("--loss", action="append", type=parse_loss, default=None,
                       help="a loss process (repeatable), JSON or kind:key=value:..., e.g. "
                            "iteration_bursts:at=279,651:loss=0.7 (replaces the params' loss list)")


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
    from ..policy import DEFAULT_ETA, DEFAULT_FREQ

    return cfg.with_(policy="fixed", p=cfg.baseline_p, p_low=None, p_high=None, eta=DEFAULT_ETA, freq=DEFAULT_FREQ)


# -- run ------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from .model import simulate

    cfg = config_from_args(args)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        cfg.to_json(out / "params.json")
    runs = [("dblp" if cfg.policy == "dblp" else cfg.policy, cfg)]
    if args.baseline:
        runs.append(("baseline", baseline_of(cfg)))
    summaries = {}
    results = {}
    for label, c in runs:
        rec = str(out / f"records-{label}.jsonl") if out else args.records
        if rec and Path(rec).exists():
            Path(rec).unlink()  # RecordWriter appends; a rerun replaces
        res = simulate(c, records=rec)
        s = res.summary()
        s.update(wall_s=res.wall_s, iterations_per_s=c.rounds / res.wall_s if res.wall_s else float("nan"),
                 datagrams=res.datagrams)
        summaries[label] = s
        results[label] = res
        print(f"{label:>9}: {c.rounds} iterations ({c.fidelity} level) in {res.wall_s:.2f} s: "
              f"round mean {s['mean_round_s'] * 1e3:.2f} ms, p99 {s['p99_round_s'] * 1e3:.2f} ms, "
              f"send mean {s['mean_up_s'] * 1e3:.2f} ms, time-to-train {s['time_to_train_s']:.3f} s, "
              f"lost up {s['lost_up'] * 100:.2f}% down {s['lost_down'] * 100:.2f}%, "
              f"passes up {s['up_passes']:.2f} down {s['down_passes']:.2f}", flush=True)
    if len(summaries) == 2:
        a, b = summaries[runs[0][0]], summaries["baseline"]
        print(f"baseline/{runs[0][0]}: mean round x{b['mean_round_s'] / a['mean_round_s']:.2f}, "
              f"p99 x{b['p99_round_s'] / a['p99_round_s']:.2f}, "
              f"time-to-train x{b['time_to_train_s'] / a['time_to_train_s']:.2f}")
    if out:
        (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
        from .plots import plot_run

        plot_run({k: r.records for k, r in results.items()}, out)
        print(f"wrote {out}/ (params.json, records-*.jsonl, summary.json, latency.png, cdf.png)")
    elif args.summary:
        Path(args.summary).write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dblp.sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate one configuration",
                       description="Simulate one configuration; print its summary and write records/plots.")
    add_config_args(r)
    r.add_argument("--baseline", action="store_true", help="also run the baseline (fixed p = P_low) and compare")
    r.add_argument("--out", default=None, help="folder for params.json, records-*.jsonl, summary.json and plots")
    r.add_argument("--records", default=None, help="JSONL file for the round records (without --out)")
    r.add_argument("--summary", default=None, help="JSON file for the summary (without --out)")
    r.set_defaults(func=cmd_run)
    from . import calibrate, sweep

    sweep.add_parser(sub)
    calibrate.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ParameterError as exc:
        print(f"dblp.sim {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dblp.sim {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
