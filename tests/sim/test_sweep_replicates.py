"""Sweeps: replicates (means, 95% intervals, bursts per seed), the resume cache, Dask."""

from __future__ import annotations

import math

import pytest

from dblp.sim import SimConfig
from dblp.sim.studies.replicates import mean_ci95, t975
from dblp.sim.studies.runners import ResultCache
from dblp.sim.studies.sweep import main as sweep_main
from dblp.sim.studies.sweep import run_config, run_sweep

BASE = SimConfig(model=100_000, workers=2, rounds=12, freq=3)
AXES = {"p_high": [0.2], "p_low": [0.008], "eta": [0.5], "freq": [3], "burst_rate": [0.2], "burst_loss": [0.7],
        "burst_len": [1], "model": [100_000], "bandwidth_bps": [10e9]}


def test_t_quantiles_and_interval():
    assert t975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t975(10) == pytest.approx(2.2281, abs=1e-4)
    assert t975(100) == pytest.approx(1.98397, abs=2e-4)
    m, h = mean_ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.302653 * 1.0 / math.sqrt(3))
    assert math.isnan(mean_ci95([5.0])[1])
    assert mean_ci95([1.0, float("nan"), 3.0])[0] == 2.0


def test_seeds_give_means_intervals_and_bursts():
    rows, info = run_sweep(BASE, AXES, jobs=1, progress=False, seeds=3)
    (row,) = rows
    assert info["seeds"] == 3 and info["runs"] == 6  # DBLP and baseline per seed
    singles = [run_sweep(BASE.with_(seed=s), AXES, jobs=1, progress=False)[0][0] for s in range(3)]
    for col in ("dblp_mean_round_s", "base_time_to_train_s", "speedup_time_to_train", "dblp_lost"):
        m, h = mean_ci95([r[col] for r in singles])
        assert row[col] == pytest.approx(m) and row[f"{col}_ci95"] == pytest.approx(h)
    counts = [int(r["dblp_burst_rounds"]) for r in singles]
    assert row["bursts_per_seed"] == ";".join(map(str, counts)) and row["bursts_total"] == sum(counts)
    assert "dblp_mean_round_s_ci95" not in singles[0]  # one seed: no interval columns


def test_interrupted_sweep_resumes_from_the_cache(tmp_path):
    cache = ResultCache(tmp_path / "cache")
    calls: list[int] = []

    def dying(d: dict) -> dict:
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(d["seed"])
        return run_config(d)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(BASE, AXES, jobs=1, progress=False, seeds=3, runner=dying, cache=cache)
    assert len(calls) == 3
    again: list[int] = []

    def counting(d: dict) -> dict:
        again.append(d["seed"])
        return run_config(d)

    rows, info = run_sweep(BASE, AXES, jobs=1, progress=False, seeds=3, runner=counting, cache=cache)
    assert info["cached"] == 3 and len(again) == 3  # only the missing half
    fresh, _ = run_sweep(BASE, AXES, jobs=1, progress=False, seeds=3)
    assert rows == fresh


def test_cache_ignores_a_damaged_file(tmp_path):
    cache = ResultCache(tmp_path)
    from dblp.sim.studies.runners import config_key

    k = config_key(BASE)
    cache.put(k, BASE, {"x": 1.0})
    assert cache.get(k, BASE) == {"x": 1.0}
    next(tmp_path.rglob("*.json")).write_text("{trunc")
    assert cache.get(k, BASE) is None
    assert cache.get(k, BASE.with_(seed=9)) is None


def test_dask_local_cluster_gives_the_same_table():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                                  dashboard_address=None) as cluster:
        rows, info = run_sweep(BASE, AXES, progress=False, seeds=2, dask=cluster.scheduler_address)
    assert info["dask"] == cluster.scheduler_address
    local, _ = run_sweep(BASE, AXES, jobs=1, progress=False, seeds=2)
    assert rows == local


def test_cli_names_bad_sweep_flags(tmp_path, capsys):
    try:  # refused by the argument parser (exit 2) or by the sweep (return 2), naming the flag
        rc = sweep_main(["--seeds", "0", "--out", str(tmp_path), "--quiet"])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    assert "--seeds" in capsys.readouterr().err
    assert sweep_main(["--dask", "nowhere", "--out", str(tmp_path), "--quiet"]) == 2
    assert "--dask" in capsys.readouterr().err

