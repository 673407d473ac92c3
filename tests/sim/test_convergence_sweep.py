"""The sweep runner around time to accuracy: a failed or interrupted run stops the sweep promptly."""

from __future__ import annotations

import time

import pytest

from dblp.sim import SimConfig
from dblp.sim.studies.runners import config_key, run_tasks


def _fail_first(d: dict) -> dict:
    if d["seed"] == 0:
        raise ValueError("boom")
    time.sleep(1.0)
    return {}


def test_a_failed_run_cancels_the_queued_ones():
    """Before, the process pool's exit waited for every queued run (Ctrl-C went on for the whole sweep)."""
    tasks = {config_key(c): c for c in (SimConfig(model=10_000, rounds=2, seed=s) for s in range(40))}
    t = time.perf_counter()
    with pytest.raises(ValueError, match="boom"):
        run_tasks(tasks, _fail_first, jobs=2, progress=False)
    assert time.perf_counter() - t < 8.0  # 39 queued runs x 1 s / 2 processes = 20 s if they all ran
