"""The simulator writes the records the real server and worker write, and reproduces itself."""

from __future__ import annotations

import json

import pytest

from dblp.protocol.records import COLUMNS, RoundRecord, read_records
from dblp.sim import simulate

from sim_helpers import small

LOSS = [{"kind": "bernoulli", "p": 0.03}, {"kind": "random_bursts", "rate": 0.2, "loss": 0.7}]


@pytest.mark.parametrize("fidelity", ["round", "packet"])
def test_records_have_the_roundrecord_columns(tmp_path, fidelity):
    cfg = small(rounds=6, fidelity=fidelity, loss=LOSS)
    path = tmp_path / "r.jsonl"
    res = simulate(cfg, records=str(path))
    assert len(res.records) == 2 * cfg.rounds * cfg.workers
    lines = path.read_text().splitlines()
    assert len(lines) == len(res.records)
    for line in lines:
        assert list(json.loads(line)) == COLUMNS
    back = list(read_records(path))
    assert [r.to_json() for r in back] == [r.to_json() for r in res.records]  # NaN is null in the file
    for r in res.records:
        assert isinstance(r, RoundRecord) and r.source == "simulation"
        assert r.chunks == cfg.layout.chunks and r.order == cfg.order and r.policy == "dblp"
    keys = {(r.role, r.worker, r.round) for r in res.records}
    assert keys == {(role, w, k) for role in ("worker", "server") for w in range(3) for k in range(cfg.rounds)}
    for r in res.records:
        if r.role == "worker":  # filled as dblp/transport/worker.py fills them
            assert r.up_sent >= r.up_received > 0 and r.up_passes >= 1 and r.down_received > 0
            assert r.down_sent == 0 and r.down_passes == 0
            assert r.round_latency_s >= r.up_latency_s > 0
            assert {"wait_start_s", "wait_server_s"} <= set(r.extra)
        else:  # ... and as dblp/transport/server.py fills them
            assert r.down_sent >= r.down_received > 0 and r.down_passes >= 1 and r.up_received > 0
            assert r.up_sent == 0 and r.up_passes == 0
            assert r.grad_norm > 0 and r.up_latency_s > 0
            assert "wait_others_s" in r.extra


@pytest.mark.parametrize("fidelity", ["round", "packet"])
def test_same_seed_same_results(fidelity):
    cfg = small(rounds=8, fidelity=fidelity, loss=LOSS + [{"kind": "gilbert_elliott", "p": 0.01}])
    a = [r.to_dict() for r in simulate(cfg).records]
    b = [r.to_dict() for r in simulate(cfg).records]
    assert a == b
    c = [r.to_dict() for r in simulate(cfg.with_(seed=cfg.seed + 1)).records]
    assert a != c


def test_dblp_and_baseline_see_the_same_bursts():
    cfg = small(rounds=30, loss=[{"kind": "random_bursts", "rate": 0.3, "loss": 0.7}])
    bursts = lambda res: sorted({r.round for r in res.records if r.extra["burst"]})  # noqa: E731
    a = bursts(simulate(cfg))
    b = bursts(simulate(cfg.with_(policy="fixed")))
    assert a == b and len(a) >= 2


def test_norms_from_csv_drive_the_policy(tmp_path):
    csv = tmp_path / "norms.csv"
    norms = [1.0] * 10 + [3.0] + [1.0] * 9  # a jump exactly at the check of step 10
    csv.write_text("iteration,grad_norm\n" + "".join(f"{i},{v}\n" for i, v in enumerate(norms)))
    cfg = small(rounds=20, freq=10, norms=str(csv), norm_model="sequence")
    sv = {r.round: r for r in simulate(cfg).records if r.role == "server" and r.worker == 0}
    assert [sv[k].grad_norm for k in range(20)] == norms
    assert sv[10].clr and sv[10].tolerance_down == cfg.baseline_p  # CLR detected: P_low until step 20
    flat = tmp_path / "flat.csv"
    flat.write_text("iteration,grad_norm\n" + "".join(f"{i},1.0\n" for i in range(20)))
    sv = {r.round: r for r in simulate(cfg.with_(norms=str(flat))).records if r.role == "server" and r.worker == 0}
    assert not sv[10].clr and sv[10].tolerance_down == cfg.effective_p_high


def test_eta_matters_with_varied_norms():
    base = small(rounds=120, freq=5, norms="varied")
    clr = [sum(r.clr for r in simulate(base.with_(eta=eta)).records if r.role == "server") for eta in (0.1, 0.5, 1.0)]
    assert clr[0] > clr[1] > clr[2]


def test_read_records_skips_and_counts_what_is_no_record_when_asked(tmp_path):
    """dblp.protocol.records.read_records, the one reader of records files: strict by default (a bad line is
    an error naming it), lenient with ``skipped`` (the calibration reads folders of mixed files)."""
    good = RoundRecord(source="simulation", role="worker", worker=0, round=3).to_json()
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([good, "not json", json.dumps({"event": "burst"}), json.dumps([1, 2]), good]) + "\n")
    with pytest.raises(ValueError, match=r"mixed.jsonl:2: not a round record"):
        list(read_records(path))
    skipped = [0]
    assert [r.round for r in read_records(path, skipped=skipped)] == [3, 3] and skipped == [3]
    assert list(read_records(tmp_path / "absent.jsonl", skipped=skipped)) == [] and skipped == [4]
    with pytest.raises(OSError):
        list(read_records(tmp_path / "absent.jsonl"))
