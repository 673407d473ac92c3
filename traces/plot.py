"""PNG plots of a trace: loss (rate) over time and the burst-length distribution.

matplotlib is imported lazily with the Agg backend, so the library and the
CLI work on headless machines and importing ``traces`` stays cheap.
"""

from __future__ import annotations

import re

import os

import numpy as np

from .model import PacketTrace, SegmentTrace
from .stats import packet_bursts, segment_bursts


#: About this many bins across the loss-over-time panel: bursts shorter than a bin are
#: averaged into it, so a trace of a thousand short bursts reads as a rate, not a barcode.
TARGET_BINS = 250


def _time_axis(duration_us: float) -> tuple[float, str]:
    if duration_us >= 5e6:
        return 1e6, "s"
    if duration_us >= 5e3:
        return 1e3, "ms"
    return 1.0, "µs"


def nice_bin(span: float, target: int = TARGET_BINS) -> int:
    """A round bin width (1, 2 or 5 times a power of ten) giving about ``target`` bins over ``span``."""
    raw = max(span / target, 1.0)
    mag = 10 ** np.floor(np.log10(raw))
    return int(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))


def _fmt_us(us: float) -> str:
    for scale, unit in ((1e6, "s"), (1e3, "ms")):
        if us >= scale:
            return f"{us / scale:g} {unit}"
    return f"{us:g} µs"


def plot_trace(
    trace: SegmentTrace | PacketTrace, path: str | os.PathLike, *, threshold: float | None = None
) -> str:
    """Write a two-panel PNG of ``trace`` to ``path``; returns the path.

    Top: loss over time. A trace of many bursts shorter than a bin (about
    :data:`TARGET_BINS` bins across it) is drawn as its loss *rate* per
    round-width time bin (the time-averaged loss in the bin,
    :meth:`SegmentTrace.resample`), on an axis scaled to it; a few or wide
    bursts as the exact steps; a packet trace as the fraction dropped per
    window of packets. Bottom: the CDF of burst lengths.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), constrained_layout=True)
    title = trace.meta.description or trace.meta.source
    title = re.sub(r"(\d) us\b", "\\1 µs", title)  # descriptions of older trace files spell microseconds "us"
    mean = trace.mean_loss()
    if isinstance(trace, SegmentTrace):
        scale, unit = _time_axis(trace.duration_us)
        _, lengths, burst_loss = segment_bursts(trace, threshold)
        blabel = "burst duration [µs]"
        width = nice_bin(trace.duration_us)
        if lengths.size <= 30 or lengths.min() >= width:  # few or wide bursts: exact steps read well
            x = np.append(trace.start_us, trace.duration_us) / scale
            ax1.step(x, np.append(trace.loss, trace.loss[-1]) * 100, where="post", lw=0.8, color="C0")
            ax1.set_ylabel("loss [%]")
            top = 100 * max(float(trace.loss.max()), mean)
        else:
            binned = trace.resample(width)
            x = np.append(binned.start_us, binned.duration_us) / scale
            y = np.append(binned.loss, binned.loss[-1]) * 100
            ax1.fill_between(x, y, step="post", alpha=0.35, color="C0", lw=0)
            ax1.step(x, y, where="post", lw=0.8, color="C0")
            ax1.set_ylabel(f"loss rate per {_fmt_us(width)} [%]")
            top = 100 * max(float(binned.loss.max()), mean)
            if lengths.size:
                ax1.text(0.01, 0.97, f"{lengths.size} bursts averaged into {_fmt_us(width)} bins; "
                         f"loss within a burst: mean {burst_loss.mean():.2g}, max {burst_loss.max():.2g}",
                         transform=ax1.transAxes, va="top", fontsize=8)
        ax1.set_xlabel(f"time [{unit}]")
    else:
        n = len(trace)
        window = nice_bin(n)
        nb = n // window
        frac = trace.drops[: nb * window].reshape(nb, window).mean(axis=1) if nb else trace.drops[:0]
        x = np.arange(nb + 1) * window
        y = np.append(frac, frac[-1] if nb else 0.0) * 100
        ax1.fill_between(x, y, step="post", alpha=0.35, color="C0", lw=0)
        ax1.step(x, y, where="post", lw=0.8, color="C0")
        ax1.set_xlabel("packet index")
        ax1.set_ylabel(f"loss per {window} packets [%]")
        top = 100 * max(float(frac.max()) if nb else 0.0, mean)
        _, lengths = packet_bursts(trace.drops)
        blabel = "burst length [packets]"
    ax1.axhline(mean * 100, color="C3", ls="--", lw=0.8, label=f"mean {mean * 100:.3g} %")
    ax1.set_ylim(0, (top or 1.0) * 1.15)
    ax1.margins(x=0)
    ax1.legend(loc="upper right")
    ax1.set_title(title[:110], fontsize=9)
    if lengths.size:
        srt = np.sort(lengths)
        ax2.step(srt, np.arange(1, srt.size + 1) / srt.size, where="post")
        if srt[-1] > 10 * max(srt[0], 1):
            ax2.set_xscale("log")
        ax2.set_ylabel("CDF")
        bunit = "µs" if isinstance(trace, SegmentTrace) else "packets"
        ax2.set_title(f"{lengths.size} bursts, mean {lengths.mean():.4g} {bunit}", fontsize=9)
    else:
        ax2.text(0.5, 0.5, "no bursts", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel(blabel)
    out = os.fspath(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
