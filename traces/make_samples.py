"""Regenerate the sample traces in ``traces/samples/``: ``python -m traces.make_samples``.

Each sample is a pure function of the parameters listed here (seeds
included), so the files are reproducible bit for bit and a test checks that
the committed files still equal what this script makes. All samples are
generated - none is a measurement - and say so in their metadata.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from . import generators as g
from .io import Trace, dumps, write_trace

SAMPLES_DIR = Path(__file__).with_name("samples")
#: numpy's Generator streams may change between numpy versions; the committed
#: files were made with this one (the reproducibility test is skipped on others).
MADE_WITH_NUMPY = "2.4"

#: file name -> (builder, one-line summary for the README)
SAMPLES: dict[str, tuple[Callable[[], Trace], str]] = {
    "bernoulli-1pct.pkts": (
        lambda: g.bernoulli_packets(0.01, 10_000, seed=1),
        "10,000 packets, independent loss 1% (netem `loss random 1%`)",
    ),
    "gilbert-elliott-netem.pkts": (
        lambda: g.gilbert_elliott_packets(0.01, 0.25, 1.0, 0.0, n_packets=10_000, seed=2),
        "10,000 packets, netem `loss gemodel 1% 25% 100% 0%`: stationary loss 3.85%, mean burst 4 packets",
    ),
    "gilbert-elliott-10g.loss.csv": (
        lambda: g.gilbert_elliott_segments(
            0.001, 0.1, 0.7, 0.0, duration_us=200_000, packet_interval_us=1.2, seed=3
        ),
        "200 ms of Gilbert-Elliott states (p=0.1%, r=10%, 1-h=70%) laid out for a 1500-byte packet "
        "every 1.2 us (10 Gbit/s)",
    ),
    "onoff-lognormal.loss.csv": (
        lambda: g.onoff_segments(duration_us=10_000_000, seed=4),
        "10 s of ON/OFF microbursts, lognormal (sigma 1): ON mean 100 us at 70% loss, OFF mean 10 ms "
        "at 0% (illustrative defaults, not fitted)",
    ),
    "onoff-pareto.loss.csv": (
        lambda: g.onoff_segments(duration_us=10_000_000, dist="pareto", alpha=1.5, on_mean_us=200.0, seed=5),
        "10 s of ON/OFF microbursts, Pareto (alpha 1.5): ON mean 200 us at 70% loss, OFF mean 10 ms",
    ),
    "paper-efficientnet-70pct.loss.csv": (
        lambda: g.iteration_burst_segments(
            loss=0.7, iteration_us=100_000, iterations=[279, 651], total_iterations=930
        ),
        "the paper's EfficientNetB0 microbursts: 70% loss during iterations 279 and 651 of 930, with a "
        "nominal 100 ms iteration (an assumption: the paper gives iteration numbers, not times)",
    ),
    "paper-resnet50-random3.loss.csv": (
        lambda: g.iteration_burst_segments(
            loss=0.7, iteration_us=100_000, count=3, total_iterations=1395, seed=6
        ),
        "70% loss for one iteration at 3 random iterations of 1395 (the paper's ResNet50 run length), "
        "nominal 100 ms iterations",
    ),
}


def build(name: str) -> Trace:
    return SAMPLES[name][0]()


def readme() -> str:
    lines = [
        "# Sample loss traces",
        "",
        "All of these are **generated** by `traces/generators.py` (provenance `generated` in each file's",
        "metadata, with the generator's name, parameters and seed). None is a measurement. Regenerate with",
        "`python -m traces.make_samples`; inspect one with `python -m traces show FILE`.",
        "The file format is described in `traces/FORMAT.md`.",
        "",
        "| file | form | mean loss | what |",
        "|---|---|---|---|",
    ]
    for name, (fn, what) in SAMPLES.items():
        tr = fn()
        lines.append(f"| `{name}` | {tr.meta.form} | {tr.mean_loss():.4%} | {what} |")
    lines += [
        "",
        "Sources of the parameters: see the docstring of `traces/generators.py` (netem's `gemodel`",
        "semantics; Benson et al. IMC'10 and Kandula et al. IMC'09 for heavy-tailed ON/OFF periods;",
        "Zhang et al. IMC'17 for microbursts of tens to hundreds of microseconds; the DBLP paper, V-B,",
        "for 70% loss during one iteration).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the samples (and their README) - only when asked: ``--help`` and ``--check`` write nothing."""
    import argparse

    from .argtypes import add_verbosity, add_version
    from .units import HelpFormatter

    ap = argparse.ArgumentParser(prog="python -m traces.make_samples", description=__doc__.split("\n\n")[0],
                                 formatter_class=HelpFormatter)
    add_version(ap)
    add_verbosity(ap)
    ap.add_argument("--check", action="store_true",
                    help="only say whether the committed samples equal what the generators make now (exit 1 if not)")
    a = ap.parse_args(argv)
    if a.check:
        stale = check()
        print("samples up to date" if not stale else f"samples that differ: {', '.join(stale)}")
        return 1 if stale else 0
    SAMPLES_DIR.mkdir(exist_ok=True)
    for name in SAMPLES:
        p = write_trace(build(name), SAMPLES_DIR / name)
        print(f"{p} ({p.stat().st_size} bytes)")
    (SAMPLES_DIR / "README.md").write_text(readme(), encoding="utf-8")
    return 0


def check() -> list[str]:
    """Names of samples whose committed file differs from what the generators make now."""
    return [n for n in SAMPLES if (SAMPLES_DIR / n).read_text(encoding="utf-8") != dumps(build(n))]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
