"""The engines' results on small configurations stay what they were (see pin_configs).

Guards the rewrites for speed (host layout, fluid queue, packet loop): every
record's passes, counts and latencies must match the pinned run - counts
exactly, times to float noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dblp.sim import SimConfig, simulate

from pin_configs import FIELDS, PIN_CONFIGS, fingerprint

PINS = json.loads((Path(__file__).parent / "data" / "engine_pins.json").read_text())


@pytest.mark.parametrize("name", sorted(PIN_CONFIGS))
def test_engine_matches_pins(name: str) -> None:
    got = fingerprint(simulate(SimConfig.from_dict(PIN_CONFIGS[name])))
    want = PINS[name]
    assert got["end_time_s"] == pytest.approx(want["end_time_s"], rel=1e-9, abs=1e-12)
    assert len(got["records"]) == len(want["records"])
    for g, w in zip(got["records"], want["records"]):
        assert g[:3] == w[:3]
        for f, a, b in zip(FIELDS, g[3:], w[3:]):
            if isinstance(b, float):
                assert a == pytest.approx(b, rel=1e-9, abs=1e-12), (name, g[:3], f)
            else:
                assert a == b, (name, g[:3], f)
