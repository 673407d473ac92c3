"""The training loop: real learning on digits, records, gradient-norm export, plumbing."""

import csv
import json
import math

import pytest
import torch

from dblp.train import (
    DropExchange,
    LocalExchange,
    TrainConfig,
    assign_flat_grad,
    export_grad_norms,
    flatten_grads,
    get_workload,
    iterations_per_epoch,
    read_grad_norms,
    train,
)


def test_small_cnn_on_digits_learns_with_local_exchange(tmp_path):
    wl = get_workload("small_cnn", seed=0)
    cfg = TrainConfig.for_workload(wl, epochs=4, device="cpu", out_dir=str(tmp_path))
    s = train(wl, LocalExchange(), cfg)
    assert s.metric == "accuracy"
    assert s.final_metric > 0.85, s.epoch_records
    assert s.iterations == 4 * iterations_per_epoch(wl, cfg) == len(s.iteration_records)
    assert s.nonfinite_iterations == 0

    # record files
    for name in ("iterations.jsonl", "iterations.csv", "epochs.jsonl", "epochs.csv", "grad_norms.csv", "summary.json"):
        assert (tmp_path / name).is_file(), name
    first = json.loads((tmp_path / "iterations.jsonl").read_text().splitlines()[0])
    for key in ("iteration", "epoch", "loss", "grad_norm", "exchange_latency_s", "workers"):
        assert key in first
    epochs = [json.loads(line) for line in (tmp_path / "epochs.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4]
    assert all("accuracy" in e and e["epoch_wall_s"] > 0 for e in epochs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final_metric"] == pytest.approx(s.final_metric)

    # gradient-norm export: header + one row per iteration, same values as the records
    with open(tmp_path / "grad_norms.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["iteration", "grad_norm"] and len(rows) == s.iterations + 1
    norms = read_grad_norms(tmp_path / "grad_norms.csv")
    assert norms == [r["grad_norm"] for r in s.iteration_records]
    again = export_grad_norms(tmp_path / "iterations.jsonl", tmp_path / "again.csv")
    assert read_grad_norms(again) == norms


def test_drop_exchange_info_lands_in_records_and_slows_learning():
    accs = {}
    for frac in (0.0, 0.9):
        wl = get_workload("small_cnn", seed=1)
        cfg = TrainConfig.for_workload(wl, epochs=1, device="cpu", lr=0.02)
        s = train(wl, DropExchange(frac, seed=0), cfg)
        rec = s.iteration_records[0]
        assert rec["chunks"] == 106 and rec["chunks_dropped"] == round(frac * 106)
        accs[frac] = s.final_metric
    assert accs[0.9] < accs[0.0]


def test_simulated_workers_shard_the_data_and_average():
    wl = get_workload("small_cnn", seed=0)
    cfg = TrainConfig.for_workload(wl, epochs=1, sim_workers=3, batch_size=16, max_iters_per_epoch=5, device="cpu")
    s = train(wl, LocalExchange(), cfg)
    assert s.workers == 3 and s.iterations == 5
    assert all(r["workers"] == 3 for r in s.iteration_records)
    assert iterations_per_epoch(wl, TrainConfig.for_workload(wl, sim_workers=3, batch_size=16)) == (1437 // 3) // 16


def test_flatten_and_assign_round_trip():
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(m.parameters())
    m(torch.randn(5, 3)).sum().backward()
    flat = flatten_grads(params)
    assert flat.numel() == sum(p.numel() for p in params)
    assign_flat_grad(params, flat * 2)
    assert torch.allclose(flatten_grads(params), flat * 2)
    with pytest.raises(ValueError, match="values"):
        assign_flat_grad(params, flat[:-1])


def test_an_exchange_returning_the_wrong_size_is_an_error():
    class Broken:
        def exchange(self, g):
            return g[:-1]

    wl = get_workload("small_cnn")
    with pytest.raises(ValueError, match="exchange returned"):
        train(wl, Broken(), TrainConfig.for_workload(wl, epochs=1, max_iters_per_epoch=1, device="cpu"))


def test_small_transformer_trains_on_the_shipped_corpus():
    wl = get_workload("small_transformer", seed=0)
    cfg = TrainConfig.for_workload(wl, epochs=2, device="cpu", eval_at_start=True, warmup_iters=4)
    s = train(wl, LocalExchange(), cfg)
    lrs = [r["lr"] for r in s.iteration_records[:6]]
    assert lrs == pytest.approx([cfg.lr * k / 4 for k in (1, 2, 3, 4)] + [cfg.lr] * 2)
    ppl = [e["perplexity"] for e in s.epoch_records]
    assert s.metric == "perplexity" and all(math.isfinite(p) for p in ppl)
    assert ppl[-1] < ppl[0] * 0.5  # from ~vocab size (60) to well below


def test_eval_every_writes_the_time_to_accuracy_curve(tmp_path):
    """evals.jsonl: a row every N iterations and at each epoch end (once when they coincide), on a
    training clock that leaves the evaluations out."""
    wl = get_workload("digits_mlp", seed=0)
    cfg = TrainConfig.for_workload(wl, epochs=2, max_iters_per_epoch=5, eval_every=2, device="cpu",
                                   out_dir=str(tmp_path))
    s = train(wl, None, cfg)
    rows = [json.loads(line) for line in open(tmp_path / "evals.jsonl")]
    assert [r["iteration"] for r in rows] == [2, 4, 5, 6, 8, 10]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
    clocks = [r["train_s"] for r in rows]
    assert clocks == sorted(clocks) and clocks[-1] == pytest.approx(s.train_s)
    assert rows[-1]["accuracy"] == s.final_metric
