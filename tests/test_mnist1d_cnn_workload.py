"""The mnist1d_cnn workload: MNIST-1D built offline and from a seed, its model, a short training, the CLI.

The full 12,000-signal set takes 10-40 s to generate on 2 cores, so these tests build small sets
(the generator is the same) and stand one in for the default set where a workload is trained.
"""

from __future__ import annotations

import argparse
import random
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mnist1d")

from dblp.train import mnist1d as m1d  # noqa: E402
from dblp.train.mnist1d import MNIST1D_LENGTH, build_mnist1d, cache_path  # noqa: E402


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection (a download) fails the test."""
    def refuse(*a: object, **k: object) -> None:
        raise AssertionError(f"network access attempted: {a!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    import requests

    monkeypatch.setattr(requests, "get", refuse)
    monkeypatch.setattr(requests.Session, "request", refuse)


@pytest.fixture
def small_set(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """The workload's builder replaced by a 1,200-signal set of the same generator (cached under tmp_path)."""
    monkeypatch.setenv("DBLP_CACHE_DIR", str(tmp_path))
    import dblp.train.models as models

    monkeypatch.setattr(models, "build_mnist1d", lambda: build_mnist1d(1200, seed=42))
    return models


def test_builds_offline_deterministically_from_a_seed(no_network: None) -> None:
    a_train, a_test = build_mnist1d(200, seed=7, cache=False)
    b_train, b_test = build_mnist1d(200, seed=7, cache=False)
    c_train, _ = build_mnist1d(200, seed=8, cache=False)
    assert torch.equal(a_train.x, b_train.x) and torch.equal(a_train.y, b_train.y)
    assert torch.equal(a_test.x, b_test.x) and torch.equal(a_test.y, b_test.y)
    assert not torch.equal(a_train.x, c_train.x)


def test_shapes_and_classes(no_network: None) -> None:
    train, test = build_mnist1d(300, seed=1, cache=False)
    assert train.x.shape == (240, 1, MNIST1D_LENGTH) and test.x.shape == (60, 1, MNIST1D_LENGTH)
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    y = torch.cat([train.y, test.y])
    assert torch.bincount(y, minlength=10).tolist() == [30] * 10  # make_dataset: equal classes, then split
    x = torch.cat([train.x, test.x])
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1.0) < 1e-3  # the package normalises the set


def test_the_callers_random_state_is_left_alone() -> None:
    np.random.seed(123)
    random.seed(123)
    want_np, want_py = np.random.rand(), random.random()
    np.random.seed(123)
    random.seed(123)
    build_mnist1d(50, seed=3, cache=False)
    assert np.random.rand() == want_np and random.random() == want_py


def test_cache_is_read_back_and_a_bad_one_rebuilt(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DBLP_CACHE_DIR", str(tmp_path))
    path = cache_path(100, seed=5)
    assert path.parent == tmp_path and "0.0.2.post1" in path.name and path != cache_path(100, seed=6)
    first, _ = build_mnist1d(100, seed=5)
    assert path.is_file()
    calls = []
    real = m1d._generate
    monkeypatch.setattr(m1d, "_generate", lambda n, s: calls.append((n, s)) or real(n, s))
    again, _ = build_mnist1d(100, seed=5)
    assert calls == [] and torch.equal(first.x, again.x)
    path.write_bytes(b"not an npz")
    rebuilt, _ = build_mnist1d(100, seed=5)
    assert calls == [(100, 5)] and torch.equal(first.x, rebuilt.x)


def test_workload_registry_entry_without_building_the_data() -> None:
    from dblp.train.loop import epoch_iterations
    from dblp.train.models import WORKLOAD_DEFAULTS, WORKLOADS, build_model, dataset_problem, train_samples

    assert "mnist1d_cnn" in WORKLOADS
    assert train_samples("mnist1d_cnn") == 9600
    d = WORKLOAD_DEFAULTS["mnist1d_cnn"]
    assert epoch_iterations(9600, d["batch_size"], world_size=3) == 100  # whole epochs of 3 workers
    model = build_model("mnist1d_cnn")
    assert sum(p.numel() for p in model.parameters()) == 109_834
    assert model(torch.zeros(4, 1, MNIST1D_LENGTH)).shape == (4, 10)
    assert dataset_problem("mnist1d_cnn") is None


def test_a_short_training_moves_the_loss(small_set) -> None:
    from dblp.train.exchange import TolerancePolicyExchange
    from dblp.train.loop import TrainConfig, train

    wl = small_set.get_workload("mnist1d_cnn", seed=0)
    assert wl.train_set.x.shape == (960, 1, MNIST1D_LENGTH)
    cfg = TrainConfig.for_workload(wl, epochs=4, sim_workers=3, eval_at_start=True, threads=1)
    s = train(wl, TolerancePolicyExchange.dblp(0.008, 0.408, seed=0), cfg)
    before, after = s.epoch_records[0]["test_loss"], s.epoch_records[-1]["test_loss"]
    assert s.iterations == 4 * 10 and after < before - 0.1, (before, after)
    assert {"clr", "server_grad_norm", "tolerance"} <= set(s.iteration_records[-1])


def test_the_scenarios_accept_the_workload(small_set) -> None:
    from dblp.cli.args import add_workload_args, check_workload_args

    ap = argparse.ArgumentParser()
    add_workload_args(ap, default="digits_mlp")
    a = ap.parse_args(["--workload", "mnist1d_cnn"])
    a.workers, a.iterations, a.seed = 3, 25, 0
    check_workload_args(ap, a)
    assert a.train["workload"] == "mnist1d_cnn" and a.train["iterations_per_epoch"] == 10
    assert a.iterations == 30 and a.elements == 109_834
    assert "mnist1d_cnn" in ap.format_help()


def test_the_worker_cli_names_it() -> None:
    from dblp.train.__main__ import build_parser

    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    assert "mnist1d_cnn" in sub.choices["worker"].format_help()


def test_plateau_iteration_reads_through_noise() -> None:
    from dblp.train.phasecheck import plateau_iteration

    evals = [(20 * (i + 1), a) for i, a in enumerate([0.2, 0.4, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9])]
    # trailing means of 5: 0.2, 0.3, 0.4, 0.5, 0.58, 0.72, 0.82, 0.88, 0.9, 0.9; within 0.01 of 0.9 from the 9th
    assert plateau_iteration(evals) == (180, pytest.approx(0.9))
    assert plateau_iteration(evals, window=1)[0] == 100
