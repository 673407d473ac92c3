"""Core R5b's ``deadline`` stop rule in the simulator: the packet level and the round level agree.

At a deadline factor of 0.9 every transfer after a receiver's first is closed at 0.9 of its clean
pass's time (the estimate's samples stay at that time: 0.9 T for 0.9 n chunks is T), so the
chunks received sit between the paper's early stop (the threshold, 70% at p = 0.3) and ``once``
(every chunk): the deadline branch decides them, in both engines.
"""

from __future__ import annotations

import pytest

from dblp.protocol import receiver as receiver_module
from dblp.sim import simulate

from sim_helpers import small, worker_mean

LATER = range(1, 8)  # rounds after every receiver's first transfer (which has no estimate: once)


def _run(rule: str, fidelity: str, **kw):
    cfg = small(rounds=8, policy="fixed", p=0.3, stop_rule=rule, fidelity=fidelity, **kw)
    res = simulate(cfg)
    frac = {a: worker_mean(res.records, a, LATER) / cfg.layout.chunks for a in ("up_received", "down_received")}
    return res.summary()["mean_round_s"], frac, res.records


@pytest.mark.parametrize("kw, up, down", [({}, 0.9005, 0.9005),
                                          (dict(send_pps=2e6, loss=[{"kind": "bernoulli", "p": 0.02}]),
                                           0.964, 0.9051)])
def test_round_and_packet_levels_agree_on_the_deadline_close(monkeypatch, kw, up, down):
    monkeypatch.setattr(receiver_module, "DEADLINE_FACTOR", 0.9)
    t_r, f_r, rec_r = _run("deadline", "round", **kw)
    t_p, f_p, rec_p = _run("deadline", "packet", **kw)
    assert t_r == pytest.approx(t_p, rel=0.02)
    assert f_r["up_received"] == pytest.approx(up, abs=0.002) and f_p["up_received"] == pytest.approx(up, abs=0.002)
    assert f_r["down_received"] == pytest.approx(down, abs=0.001)
    assert f_p["down_received"] == pytest.approx(down, abs=0.001)
    # the first round has no estimate: every worker's broadcast holds what once would (all, when lossless)
    if not kw:
        assert {r.down_received for r in rec_r + rec_p if r.role == "worker" and r.round == 0} == {553}
    # neither the early stop's threshold nor once's every chunk
    _, early, _ = _run("early", "round", **kw)
    _, once, _ = _run("once", "round", **kw)
    assert early["up_received"] == pytest.approx(0.7016, abs=0.001)
    assert early["up_received"] + 0.15 < f_r["up_received"] < once["up_received"] - 0.01


def test_at_the_default_factor_a_clean_run_is_once(monkeypatch):
    """Transfers no slower than their estimate are never closed by the deadline (2x)."""
    _, dl, _ = _run("deadline", "round")
    _, once, _ = _run("once", "round")
    assert dl == once == {"up_received": 1.0, "down_received": 1.0}


def test_the_class_level_refuses_the_deadline_by_name():
    from dblp.protocol.wire import ParameterError

    with pytest.raises(ParameterError, match="does not apply to stop_rule='deadline' .*use fidelity='round'"):
        simulate(small(rounds=2, fidelity="class", stop_rule="deadline"))
