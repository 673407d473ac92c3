"""``python -m traces``: generate, inspect, import and resample loss traces.

Every command has ``--help``. Probabilities are accepted as fractions
(``0.7``) or percentages (``70%``). Examples::

    python -m traces generate onoff --duration 10s --seed 1 -o burst.loss.csv
    python -m traces generate gilbert-elliott --good-to-bad 1% --bad-to-good 25% --packets 100000 -o ge.pkts
    python -m traces show burst.loss.csv            # summary + burst.loss.png
    python -m traces import-tcp sender.pcap -o tcp.pkts
    python -m traces import-netem "loss gemodel 1% 25%" --packets 100000 -o ge.pkts

A trace from captures of DBLP datagrams needs DBLP's wire format, which
lives one layer up: ``python -m dblp.results.traceimport --sent s.pcap --received r.pcap -o run.pkts``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from . import generators as gen
from .argtypes import int_arg, int_list, pos_int, prob
from .errors import TraceError
from .io import read_trace, write_trace
from .model import PacketTrace, SegmentTrace
from .stats import summarize
from .units import HelpFormatter, UnitError, parse_duration, use_help_formatter
from .argtypes import add_verbosity, add_version


def micros(text: str, *, allow_zero: bool = False) -> int:
    """argparse type: a duration (``10s``, ``100ms``, ``250us``; a bare number is seconds) in whole
    microseconds, the unit of the trace format."""
    try:
        us = round(parse_duration(text, allow_zero=allow_zero) * 1e6)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if us <= 0 and not allow_zero:
        raise argparse.ArgumentTypeError(f"{text!r} is shorter than a microsecond")
    return us


def micros_float(text: str) -> float:
    """argparse type: a duration (``1.2us``) in microseconds, fractions kept."""
    try:
        return parse_duration(text, allow_zero=False) * 1e6
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def micros_list(text: str) -> list[int]:
    """argparse type: comma-separated durations (``0,100ms,250ms``) in microseconds."""
    return [micros(x, allow_zero=True) for x in text.split(",") if x.strip()]


def _common_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, help="trace file to write (.gz compresses)")
    p.add_argument("--seed", type=int_arg(0), default=None, help="RNG seed, recorded in the metadata")
    p.add_argument("--description", default=None, help="replace the generated description")
    p.add_argument("--loop", action="store_true", help="mark the trace to repeat past its end on replay")


def _span(p: argparse.ArgumentParser, interval_help: str | None = None) -> None:
    """``--packets`` or ``--duration``, the trace's extent; with ``interval_help`` (a model with a
    per-packet form) the packets' spacing, ``--packet-interval``, beside them."""
    g = p.add_mutually_exclusive_group(required=True)
    if interval_help is not None:
        g.add_argument("--packets", type=pos_int, help="per-packet form with this many packets")
    g.add_argument("--duration", dest="duration_us", type=micros,
                   help="segments form lasting this long, e.g. 10s or 500ms; a bare number is seconds")
    if interval_help is not None:
        p.add_argument("--packet-interval", dest="packet_interval_us", type=micros_float, help=interval_help)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m traces", description=__doc__, formatter_class=HelpFormatter
    )
    add_version(ap)  # every entry point answers --version
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="sample a trace from a loss model", description="Sample a trace from a loss model.")
    kinds = g.add_subparsers(dest="kind", required=True, metavar="KIND")

    b = kinds.add_parser("bernoulli", help="independent loss per packet", description="Independent loss per packet.")
    b.add_argument("--loss", type=prob, required=True, help="loss probability")
    _span(b, "packet spacing to record (packets form), e.g. 1.2us")
    _common_out(b)

    ge = kinds.add_parser(
        "gilbert-elliott",
        aliases=["ge"],
        help="two-state bursty loss, netem 'gemodel p r 1-h 1-k'",
        description="Gilbert-Elliott loss parameterised as netem's 'loss gemodel p r 1-h 1-k'. "
        "Defaults as iproute2: r = 1-p, 1-h = 100%%, 1-k = 0.",
    )
    ge.add_argument("--good-to-bad", dest="p", type=prob, required=True, help="P(good -> bad) per packet (netem p)")
    ge.add_argument("--bad-to-good", dest="r", type=prob, default=None,
                    help="P(bad -> good) per packet (netem r; default 1 - good-to-bad)")
    ge.add_argument("--one-minus-h", "--bad-loss", dest="bad_loss", type=prob, default=1.0, help="loss probability in the bad state (netem 1-h)")
    ge.add_argument("--one-minus-k", "--good-loss", dest="good_loss", type=prob, default=0.0, help="loss probability in the good state (netem 1-k)")
    _span(ge, "packet spacing, e.g. 1.2us; required for the segments form")
    _common_out(ge)

    oo = kinds.add_parser(
        "onoff",
        help="ON/OFF microbursts with heavy-tailed durations",
        description="ON/OFF microbursts (Benson et al. IMC'10, Kandula et al. IMC'09; durations of tens to "
        "hundreds of us per Zhang et al. IMC'17). Defaults are illustrative, not fitted.",
    )
    _span(oo)
    oo.add_argument("--on-mean", dest="on_mean_us", type=micros_float, default="100us", help="mean burst (ON) duration")
    oo.add_argument("--off-mean", dest="off_mean_us", type=micros_float, default="10ms", help="mean gap (OFF) duration")
    oo.add_argument("--on-loss", type=prob, default=0.7, help="loss during a burst (default 0.7)")
    oo.add_argument("--off-loss", type=prob, default=0.0, help="loss between bursts (default 0)")
    oo.add_argument("--dist", choices=gen.DISTRIBUTIONS, default="lognormal", help="duration distribution")
    oo.add_argument("--sigma", type=float, default=1.0, help="lognormal shape (sigma of log)")
    oo.add_argument("--alpha", type=float, default=1.5, help="Pareto tail index (> 1)")
    oo.add_argument("--start-on", action="store_true", help="begin with a burst")
    _common_out(oo)

    ib = kinds.add_parser(
        "iteration-burst",
        help="the paper's 70%% loss for one iteration",
        description="Loss BURST_LOSS during whole training iterations (the DBLP paper's microburst, V-B).",
    )
    ib.add_argument("--burst-loss", dest="loss", type=prob, default=0.7, help="loss during a burst iteration (default 0.7)")
    ib.add_argument("--base-loss", type=prob, default=0.0, help="loss in other iterations (default 0)")
    w = ib.add_mutually_exclusive_group(required=True)
    w.add_argument("--iteration-period", dest="iteration_us", type=micros_float,
                   help="nominal iteration period, e.g. 100ms")
    w.add_argument("--boundaries", dest="boundaries_us", type=micros_list,
                   help="iteration start times, comma-separated durations, first 0, last = end (e.g. 0,95ms,210ms)")
    c = ib.add_mutually_exclusive_group(required=True)
    c.add_argument("--bursts", dest="iterations", type=int_list, help="burst iteration indices, e.g. 279,651")
    c.add_argument("--count", type=pos_int, help="choose this many burst iterations at random (seeded)")
    ib.add_argument("--iterations", dest="total_iterations", type=pos_int, help="iterations in the run (e.g. 930)")
    ib.add_argument("--duration", dest="duration_us", type=micros,
                    help="trace length, e.g. 90s (default: end of the last iteration)")
    _common_out(ib)

    s = sub.add_parser("show", help="summary and PNG plot of a trace", description="Print a trace's summary (mean loss, bursts, burst lengths) and write a PNG plot.")
    s.add_argument("file", help="trace file")
    s.add_argument("--png", default=None, help="plot path (default: FILE with .png suffix)")
    s.add_argument("--no-plot", action="store_true", help="do not plot")
    s.add_argument("--threshold", type=prob, default=None, help="burst threshold for segments (default: mean loss)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")

    t = sub.add_parser("import-tcp", help="trace from a TCP flow's retransmissions", description="Loss trace from a sender-side capture of a TCP flow: a retransmitted segment marks the earlier copy lost.")
    t.add_argument("capture", help="sender-side pcap capture")
    t.add_argument("--flow", help='"SRC:SPORT>DST:DPORT" (default: the flow with most payload)')
    add_capture_output_args(t)

    for name, helptext in (("import-netem", "netem options"), ("import-mahimahi", "a mahimahi command line")):
        m = sub.add_parser(name, help=f"sample a trace from {helptext}", description=f"Sample a trace from {helptext} (where it maps to loss).")
        m.add_argument("desc", help="e.g. 'loss gemodel 1%% 25%%'" if name == "import-netem" else "e.g. 'mm-loss uplink 0.01'")
        if name == "import-mahimahi":
            m.add_argument("--direction", choices=("uplink", "downlink"), default="uplink",
                           help="which mm-loss direction to sample")
        _span(m, "packet spacing, e.g. 1.2us (Gilbert-Elliott segments, ON/OFF packets)")
        _common_out(m)

    r = sub.add_parser("resample", help="coarsen a segments trace to fixed bins", description="Average a segments trace over fixed bins (mean loss kept), for replayers that cannot switch faster.")
    r.add_argument("file", help="segments trace to coarsen")
    r.add_argument("--bin", dest="bin_us", type=micros, required=True, help="bin width, e.g. 1ms")
    r.add_argument("-o", "--output", required=True, help="trace file to write")
    add_verbosity(ap)  # -q/-v on every subcommand
    return use_help_formatter(ap)


def add_capture_output_args(p: argparse.ArgumentParser) -> None:
    """Output flags of a capture importer (here and in :mod:`dblp.results.traceimport`)."""
    p.add_argument("-o", "--output", required=True, help="trace file to write")
    p.add_argument("--bin", dest="bin_us", type=micros,
                   help="write the segments form with this bin width (e.g. 1ms) instead of per-packet")
    p.add_argument("--provenance", choices=("measured", "generated"), default="measured",
                   help="'generated' when the capture came from an emulated/generated loss")
    p.add_argument("--description", default="", help="description recorded in the trace's metadata")


def write_result(tr: SegmentTrace | PacketTrace, args: argparse.Namespace) -> int:
    """Apply ``--description``/``--loop``, write ``--output`` and print one line about it."""
    changes = {}
    if getattr(args, "description", None):
        changes["description"] = args.description
    if getattr(args, "loop", False):
        changes["loop"] = True
    if changes:
        meta = tr.meta.with_(**changes)
        tr = PacketTrace(tr.drops, meta) if isinstance(tr, PacketTrace) else SegmentTrace(
            tr.start_us, tr.loss, tr.duration_us, tr.rate_bps, tr.queue_pkts, meta
        )
    out = write_trace(tr, args.output)
    print(f"wrote {out}: {tr.meta.form}, {len(tr)} {'packets' if isinstance(tr, PacketTrace) else 'segments'}, "
          f"mean loss {tr.mean_loss():.6g}")
    return 0


def _generate(a: argparse.Namespace) -> SegmentTrace | PacketTrace:
    if a.kind == "bernoulli":
        if a.packets:
            return gen.bernoulli_packets(a.loss, a.packets, seed=a.seed, packet_interval_us=a.packet_interval_us)
        return gen.bernoulli_segments(a.loss, a.duration_us, seed=a.seed)
    if a.kind in ("gilbert-elliott", "ge"):
        if a.packets:
            return gen.gilbert_elliott_packets(a.p, a.r, a.bad_loss, a.good_loss, n_packets=a.packets, seed=a.seed,
                                               packet_interval_us=a.packet_interval_us)
        if not a.packet_interval_us:
            raise TraceError("the segments form of gilbert-elliott needs --packet-interval")
        return gen.gilbert_elliott_segments(a.p, a.r, a.bad_loss, a.good_loss, duration_us=a.duration_us,
                                            packet_interval_us=a.packet_interval_us, seed=a.seed)
    if a.kind == "onoff":
        return gen.onoff_segments(duration_us=a.duration_us, on_mean_us=a.on_mean_us, off_mean_us=a.off_mean_us,
                                  on_loss=a.on_loss, off_loss=a.off_loss, dist=a.dist, sigma=a.sigma,
                                  alpha=a.alpha, start_on=a.start_on, seed=a.seed)
    return gen.iteration_burst_segments(loss=a.loss, base_loss=a.base_loss, iteration_us=a.iteration_us,
                                        boundaries_us=a.boundaries_us, iterations=a.iterations, count=a.count,
                                        total_iterations=a.total_iterations, duration_us=a.duration_us, seed=a.seed)


def _show(a: argparse.Namespace) -> int:
    tr = read_trace(a.file)
    s = summarize(tr, a.threshold)
    if a.json:
        print(json.dumps(s.as_dict(), indent=2))
    else:
        print(f"trace:       {a.file}")
        print(s.text())
    if not a.no_plot:
        from .plot import plot_trace

        png = a.png or str(Path(a.file).with_suffix(".png"))
        plot_trace(tr, png, threshold=a.threshold)
        if not a.json:
            print(f"plot:        {png}")
    return 0


MOVED = {"import-dblp": "python -m dblp.results.traceimport"}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in MOVED:
        print(f"error: {args[0]} moved to `{MOVED[args[0]]}` (same options): it reads DBLP's wire format, "
              "which traces (the lowest layer) does not import", file=sys.stderr)
        return 2
    ap = build_parser()
    a = ap.parse_args(args)
    try:
        if a.cmd == "generate":
            return write_result(_generate(a), a)
        if a.cmd == "show":
            return _show(a)
        if a.cmd == "import-tcp":
            from .import_pcap import import_tcp_retransmissions

            imp = import_tcp_retransmissions(a.capture, flow=a.flow, provenance=a.provenance,
                                             description=a.description)
            print(json.dumps(imp.stats))
            return write_result(imp.segments(a.bin_us) if a.bin_us else imp.packets, a)
        if a.cmd in ("import-netem", "import-mahimahi"):
            from .import_desc import parse_mahimahi, parse_netem

            model = parse_netem(a.desc) if a.cmd == "import-netem" else parse_mahimahi(a.desc, a.direction)
            if model.ignored:
                print(f"ignored (no loss meaning): {'; '.join(model.ignored)}", file=sys.stderr)
            if a.packets:
                tr = model.packets(a.packets, seed=a.seed, packet_interval_us=a.packet_interval_us)
            else:
                tr = model.segments(a.duration_us, seed=a.seed, packet_interval_us=a.packet_interval_us)
            return write_result(tr, a)
        if a.cmd == "resample":
            tr = read_trace(a.file)
            if not isinstance(tr, SegmentTrace):
                raise TraceError("resample works on a segments trace")
            return write_result(tr.resample(a.bin_us), a)
    except TraceError as e:  # includes TraceFormatError and NotMappableError
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory: ask for fewer --packets or a shorter --duration", file=sys.stderr)
        return 2
    ap.error(f"unknown command {a.cmd}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
