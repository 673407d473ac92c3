"""PNG plots of a trace: loss over time and the burst-length distribution.

matplotlib is imported lazily with the Agg backend, so the library and the
CLI work on headless machines and importing ``traces`` stays cheap.
"""

from __future__ import annotations

import os

import numpy as np

from .model import PacketTrace, SegmentTrace
from .stats import packet_bursts, segment_bursts


def _time_axis(duration_us: float) -> tuple[float, str]:
    if duration_us >= 5e6:
        return 1e6, "s"
    if duration_us >= 5e3:
        return 1e3, "ms"
    return 1.0, "us"


def plot_trace(
    trace: SegmentTrace | PacketTrace, path: str | os.PathLike, *, threshold: float | None = None
) -> str:
    """Write a two-panel PNG of ``trace`` to ``path``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), constrained_layout=True)
    title = trace.meta.description or trace.meta.source
    mean = trace.mean_loss()
    if isinstance(trace, SegmentTrace):
        scale, unit = _time_axis(trace.duration_us)
        x = np.append(trace.start_us, trace.duration_us) / scale
        y = np.append(trace.loss, trace.loss[-1])
        ax1.step(x, y, where="post", lw=0.8)
        ax1.set_xlabel(f"time [{unit}]")
        ax1.set_ylabel("loss probability")
        _, lengths, _ = segment_bursts(trace, threshold)
        blabel = "burst duration [us]"
    else:
        n = len(trace)
        window = max(1, n // 500)
        nb = n // window
        frac = trace.drops[: nb * window].reshape(nb, window).mean(axis=1) if nb else trace.drops[:0]
        ax1.step(np.arange(nb) * window, frac, where="post", lw=0.8)
        ax1.set_xlabel("packet index")
        ax1.set_ylabel(f"loss fraction per {window} packets")
        _, lengths = packet_bursts(trace.drops)
        blabel = "burst length [packets]"
    ax1.axhline(mean, color="C3", ls="--", lw=0.8, label=f"mean {mean:.4g}")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend(loc="upper right")
    ax1.set_title(title[:110], fontsize=9)
    if lengths.size:
        srt = np.sort(lengths)
        ax2.step(srt, np.arange(1, srt.size + 1) / srt.size, where="post")
        if srt[-1] > 10 * max(srt[0], 1):
            ax2.set_xscale("log")
        ax2.set_ylabel("CDF")
        ax2.set_title(f"{lengths.size} bursts, mean {lengths.mean():.4g}", fontsize=9)
    else:
        ax2.text(0.5, 0.5, "no bursts", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel(blabel)
    out = os.fspath(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
