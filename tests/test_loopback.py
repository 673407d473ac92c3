"""The one-call loopback timing API and its command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dblp.runs.gradients import model_elements
from dblp.runs.loopback import loopback_rounds
from dblp.protocol.wire import ParameterError


def test_loopback_rounds_times_every_round():
    res = loopback_rounds(200_000, workers=2, rounds=3, warmup=1, timeout=120)
    assert len(res.round_s) == len(res.up_s) == len(res.down_s) == 3
    assert all(0 < r < 30 for r in res.round_s)
    assert all(u < r and d < r for u, d, r in zip(res.up_s, res.down_s, res.round_s))
    assert min(res.round_s) <= res.median_s <= max(res.round_s)


@pytest.mark.parametrize("kw, what", [({"elements": 0}, "elements"), ({"elements": 10, "p": 1.5}, "p"),
                                      ({"elements": 10, "order": "random"}, "order"),
                                      ({"elements": 10, "mtu": 40}, "mtu"), ({"elements": 10, "rounds": 0}, "rounds")])
def test_bad_parameters_are_refused_by_name(kw, what):
    elements = kw.pop("elements")
    with pytest.raises(ParameterError, match=what):
        loopback_rounds(elements, **kw)


def test_cli_prints_json():
    out = subprocess.run([sys.executable, "-m", "dblp", "loopback", "--model", "100k", "--workers", "2",
                          "--iterations", "2", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["elements"] == 100_000 and len(res["round_s"]) == 2


def test_sizes_with_suffixes():
    assert model_elements("25M") == 25_000_000 and model_elements("100k") == 100_000
    assert model_elements("1e6") == 1_000_000 and model_elements("resnet50") == 25_000_000
    with pytest.raises(ParameterError, match="model"):
        model_elements("25Q")
