"""Exchanges: exact chunk drops, phase schedules, policy stand-in, adapters."""

import math

import pytest
import torch

from dblp.train.exchange import (
    CHUNK_FLOATS,
    AllreduceExchange,
    DropExchange,
    LocalExchange,
    TolerancePolicyExchange,
    exchange_group,
    num_chunks,
    phase_fraction,
    zero_chunks,
)


def _zeroed_chunks(out: torch.Tensor, chunk: int) -> list[int]:
    n = out.numel()
    return [c for c in range(num_chunks(n, chunk)) if bool((out[c * chunk : (c + 1) * chunk] == 0).all())]


def test_chunk_size_is_one_1500_byte_datagram():
    assert CHUNK_FLOATS == 362


@pytest.mark.parametrize("elements", [362 * 50, 362 * 50 + 17, 1000, 5])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.4, 0.8, 1.0])
def test_drop_exchange_zeroes_exactly_the_requested_fraction(elements, fraction):
    g = torch.rand(elements) + 0.5  # no natural zeros
    ex = DropExchange(fraction, seed=3)
    out = ex.exchange(g)
    chunks = num_chunks(elements, CHUNK_FLOATS)
    expected = round(fraction * chunks)
    zeroed = _zeroed_chunks(out, CHUNK_FLOATS)
    assert len(zeroed) == expected
    info = ex.last_info()
    assert info["chunks"] == chunks and info["chunks_dropped"] == expected
    # every other value is untouched, nothing rescaled
    keep = torch.ones(elements, dtype=torch.bool)
    for c in zeroed:
        keep[c * CHUNK_FLOATS : (c + 1) * CHUNK_FLOATS] = False
    assert torch.equal(out[keep], g[keep])
    assert g.min() > 0  # the input was not modified in place


def test_drop_exchange_picks_different_chunks_each_round_and_is_seeded():
    g = torch.ones(362 * 100)
    a, b = DropExchange(0.4, seed=1), DropExchange(0.4, seed=1)
    r1, r2 = a.exchange(g), a.exchange(g)
    assert not torch.equal(r1, r2)
    assert torch.equal(r1, b.exchange(g)) and torch.equal(r2, b.exchange(g))


def test_drop_exchange_keeps_shape_and_custom_chunk_size():
    g = torch.ones(10, 10)
    out = DropExchange(0.5, chunk_floats=10).exchange(g)
    assert out.shape == g.shape and out.dtype == torch.float32
    assert int((out == 0).all(dim=1).sum()) == 5


def test_zero_chunks_handles_a_short_last_chunk():
    x = torch.ones(25)
    zero_chunks(x, torch.tensor([2]), chunk_floats=10)
    assert x[:20].eq(1).all() and x[20:].eq(0).all()


def test_phase_fraction_schedules_by_iteration():
    f = phase_fraction(0.8, 3, 9, iters_per_epoch=10)
    assert [f(i) for i in (0, 29, 30, 89, 90)] == [0.0, 0.0, 0.8, 0.8, 0.0]
    ex = DropExchange(phase_fraction(1.0, 1, 2, iters_per_epoch=2))
    g = torch.ones(724)
    dropped = [ex.exchange(g).eq(0).all().item() for _ in range(6)]
    assert dropped == [False, False, True, True, False, False]


def test_drop_exchange_rejects_bad_fraction():
    with pytest.raises(ValueError):
        DropExchange(1.5).exchange(torch.ones(10))


def test_local_exchange_identity_and_mean():
    ex = LocalExchange()
    g = torch.randn(7)
    assert torch.equal(ex.exchange(g), g)
    out = exchange_group(ex, [torch.ones(3), 3 * torch.ones(3)])
    assert torch.equal(out, 2 * torch.ones(3))
    assert ex.last_info()["workers"] == 2


def test_exchange_group_falls_back_to_mean_then_exchange():
    class Doubler:
        def exchange(self, g):
            return 2 * g

    assert torch.equal(exchange_group(Doubler(), [torch.ones(2), torch.zeros(2)]), torch.ones(2))


def test_tolerance_policy_fixed_drops_the_tolerance_bound_each_way():
    from dblp.protocol.policy import needed_chunks

    n = 362 * 100
    ex = TolerancePolicyExchange.fixed(0.4, seed=0)
    ex.exchange_group([torch.ones(n), torch.ones(n)])
    info = ex.last_info()
    lost = 100 - needed_chunks(100, 0.4)
    assert info["up_dropped"] == 2 * lost and info["down_dropped"] == lost
    assert info["tolerance"] == 0.4


def test_tolerance_policy_dblp_starts_critical_then_relaxes_on_steady_norms():
    ex = TolerancePolicyExchange.dblp(0.0, 0.4, freq=5, directions="down")
    g = torch.ones(362 * 10)
    tol = []
    for _ in range(12):
        ex.exchange(g)
        tol.append(ex.last_info()["tolerance"])
    assert tol[:5] == [0.0] * 5  # training starts in the critical regime
    # the norm stays steady (only the up side is lossless here), so P_high follows the first check
    assert tol[6:] == [0.4] * 6


def test_allreduce_adapter_reports_worker_record():
    class FakeRecord:
        def to_dict(self):
            return {"tolerance_up": 0.4, "clr": False, "grad_norm": 1.0}

    class FakeWorker:
        last_record = FakeRecord()

        def allreduce(self, t):
            return t * 0.5

    ex = AllreduceExchange(FakeWorker())
    out = ex.exchange(torch.ones(4))
    assert torch.equal(out, 0.5 * torch.ones(4))
    info = ex.last_info()
    assert info["tolerance_up"] == 0.4 and "latency_s" in info and math.isfinite(info["latency_s"])
    with pytest.raises(TypeError):
        AllreduceExchange(object())
