"""The shipped samples: valid, generated, listed, and reproducible from their parameters."""

from __future__ import annotations

import numpy as np
import pytest

from traces import read_trace
from traces.make_samples import MADE_WITH_NUMPY, SAMPLES, SAMPLES_DIR, check


def sample_files():
    return sorted(p for p in SAMPLES_DIR.iterdir() if p.name.endswith((".csv", ".pkts", ".gz")))


def test_every_sample_is_valid_generated_and_listed():
    readme = (SAMPLES_DIR / "README.md").read_text()
    files = sample_files()
    assert {p.name for p in files} == set(SAMPLES)
    for p in files:
        tr = read_trace(p)
        assert tr.meta.provenance == "generated", p
        assert tr.meta.generator and tr.meta.generator["params"], p
        assert f"`{p.name}`" in readme
        assert p.stat().st_size < 64_000  # small files


@pytest.mark.skipif(
    ".".join(np.__version__.split(".")[:2]) != MADE_WITH_NUMPY,
    reason="numpy Generator streams may differ between numpy versions",
)
def test_samples_reproduce_from_their_parameters():
    assert check() == []
