"""The loss-over-time panel reads as a rate: many short bursts are binned, never a solid barcode."""

from __future__ import annotations

from pathlib import Path

import pytest

from traces import read_trace
from traces.plot import TARGET_BINS, nice_bin, plot_trace

SAMPLES = Path(__file__).resolve().parents[2] / "traces" / "samples"


def test_nice_bin_is_round_and_near_the_target():
    assert nice_bin(10_000_000) == 50_000  # 10 s -> 50 ms bins
    assert nice_bin(200_000) == 1_000
    assert nice_bin(10) == 1
    for span in (1e3, 3.7e5, 9.9e7):
        assert TARGET_BINS / 2.5 <= span / nice_bin(span) <= TARGET_BINS


@pytest.mark.parametrize("name, rate_axis", [("onoff-lognormal.loss.csv", True),
                                             ("paper-resnet50-random3.loss.csv", False)])
def test_trace_plot_bins_many_short_bursts(tmp_path, name, rate_axis, monkeypatch):
    import matplotlib.figure

    seen = {}
    orig = matplotlib.figure.Figure.savefig

    def spy(fig, *a, **k):
        ax = fig.axes[0]
        seen["ylabel"], seen["ylim"] = ax.get_ylabel(), ax.get_ylim()
        return orig(fig, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    out = plot_trace(read_trace(SAMPLES / name), tmp_path / "t.png")
    assert Path(out).stat().st_size > 10_000
    if rate_axis:  # 1030 bursts of ~100 µs at 0.7 in 10 s: a few percent per 50 ms bin
        assert seen["ylabel"] == "loss rate per 50 ms [%]" and seen["ylim"][1] < 10
    else:  # three bursts of one iteration each: the exact steps, up to 70 %
        assert seen["ylabel"] == "loss [%]" and 70 < seen["ylim"][1] < 90
