"""Tolerance policies and the reduce step."""

from __future__ import annotations

import numpy as np
import pytest

from dblp.protocol.policy import DblpPolicy, FixedPolicy, ReliablePolicy, make_policy
from dblp.protocol.reduce import reduce_mean_norm
from dblp.protocol.wire import ChunkLayout, ParameterError


def test_defaults_follow_the_paper():
    p = make_policy("dblp")
    assert p.p_low == pytest.approx(0.008) and p.p_high == pytest.approx(0.408) and p.eta == 0.5
    assert p.tolerance == p.p_low and p.clr  # starts in the critical regime


def test_clr_switching():
    pol = DblpPolicy(p_low=0.01, p_high=0.41, eta=0.5, freq=5)
    norms = [10.0] * 12 + [30.0] + [30.0] * 7  # a jump at step 12 (not a check), 15 compares 30 vs 30
    tol = [pol.update(s, n) for s, n in enumerate(norms)]
    assert tol[:5] == [0.01] * 5  # P_low until the first check at step freq
    assert tol[5:15] == [0.41] * 10  # no change at steps 5 and 10
    assert tol[15] == 0.41  # step 15 compares 30 with 30
    pol2 = DblpPolicy(p_low=0.01, p_high=0.41, eta=0.5, freq=5)
    norms2 = [10.0] * 10 + [4.0] + [4.0] * 9  # drop of 60% exactly at check step 10
    tol2 = []
    clr2 = []
    for s, n in enumerate(norms2):
        tol2.append(pol2.update(s, n))
        clr2.append(pol2.clr)
    assert tol2[5:10] == [0.41] * 5 and not any(clr2[5:10])
    assert tol2[10:15] == [0.01] * 5 and all(clr2[10:15])  # detected at check step 10
    assert tol2[15] == 0.41 and not clr2[15]  # CLR lasts until the next check


def test_detection_equation():
    pol = DblpPolicy(eta=0.5)
    assert pol.detect(10.0, 5.0) and pol.detect(10.0, 15.0)
    assert not pol.detect(10.0, 5.1)
    assert not pol.detect(None, 1.0)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(p_low=-0.1), "p_low"),
        (dict(p_high=1.0), "p_high"),
        (dict(eta=-1), "eta"),
        (dict(freq=0), "freq"),
        (dict(p_low=0.5, p_high=0.1), "p_high"),
    ],
)
def test_bad_parameters_named(kwargs, name):
    with pytest.raises(ParameterError, match=name):
        DblpPolicy(**kwargs)


def test_fixed_and_reliable():
    with pytest.raises(ParameterError, match="p must be"):
        FixedPolicy(1.5)
    assert FixedPolicy(0.024).update(3, 1.0) == 0.024
    assert ReliablePolicy().update(0, 1.0) == 0.0
    with pytest.raises(ParameterError, match="policy"):
        make_policy("magic")


def test_reduce_zero_fill_and_unbiased():
    lay = ChunkLayout(362 * 2 + 10)  # 3 chunks, short tail
    a = np.ones(lay.elements, np.float32) * 3
    b = np.ones(lay.elements, np.float32) * 6
    ma = np.array([True, True, True])
    mb = np.array([True, False, False])
    b[362:] = 0  # zero-filled where b missed
    out = np.empty(lay.elements, np.float32)
    norm = reduce_mean_norm([a, b], [ma, mb], lay, out, "zero")
    assert np.allclose(out[:362], 4.5) and np.allclose(out[362:], 1.5)
    assert norm == pytest.approx(float(np.linalg.norm(out.astype(np.float64))), rel=1e-9)
    reduce_mean_norm([a, b], [ma, mb], lay, out, "unbiased")
    assert np.allclose(out[:362], 4.5) and np.allclose(out[362:], 3.0)
    none = np.array([False, False, False])
    a2 = np.zeros_like(a)
    assert reduce_mean_norm([a2, a2], [none, none], lay, out, "unbiased") == 0.0
    assert (out == 0).all()


# -- names and pass arithmetic (dblp.protocol.policy: one home each) -------------------------------------------
def test_named_runs_translate_to_one_policy_everywhere():
    from dblp.protocol.policy import parse_runs, run_policy

    assert run_policy("reliable").flags() == ["--policy", "reliable"]
    base = run_policy("baseline", 0.008)
    assert base.flags() == ["--policy", "baseline", "--p", "0.008"] and isinstance(base.build(), FixedPolicy)
    assert base.config() == run_policy("fixed", 0.008).config()  # the baseline is the fixed policy at P_low
    d = run_policy("dblp", 0.008, None, 0.5, 10)
    assert d.p_high == 0.408 and isinstance(d.build(), DblpPolicy)  # P_low + k, not 0.40800000000000003
    assert d.flags() == ["--policy", "dblp", "--p-low", "0.008", "--eta", "0.5", "--freq", "10", "--p-high", "0.408"]
    assert make_policy("dblp", p_low=0.008).p_high == 0.408
    assert isinstance(run_policy("reliable").build(), ReliablePolicy)
    assert parse_runs("reliable, baseline,dblp") == ["reliable", "baseline", "dblp"]
    for bad in (lambda: run_policy("mlt"), lambda: run_policy("dblp", 0.5, 0.1), lambda: parse_runs("dblp,x"),
                lambda: parse_runs(" , ")):
        with pytest.raises(ParameterError):
            bad()


def test_server_flags_of_a_named_run_parse_back_to_the_same_policy():
    from dblp.cli.commands import build_parser
    from dblp.protocol.policy import run_policy

    for name in ("reliable", "baseline", "dblp"):
        spec = run_policy(name, 0.01, 0.3, 0.4, 7)
        a = build_parser().parse_args(["server", *spec.flags()])
        got = make_policy(a.policy, p=a.p, p_low=a.p_low, p_high=a.p_high, eta=a.eta, freq=a.freq)
        assert got == spec.build()


def test_passes_needed_is_the_papers_arithmetic():
    from dblp.protocol.policy import passes_needed

    assert passes_needed(0.7, 0.008) == 14 and passes_needed(0.7, 0.408) == 3  # paper V-B
    assert passes_needed(0.0, 0.0) == 1 and passes_needed(1.0, 0.5) == 1000 and passes_needed(0.7, 0.0) == 1000
    for loss in (0.1, 0.5, 0.7, 0.9):
        for tol in (0.001, 0.008, 0.1, 0.408):
            k = passes_needed(loss, tol)
            assert 1 - loss**k >= 1 - tol - 1e-12 and (k == 1 or 1 - loss ** (k - 1) < 1 - tol)
    # with a chunk count, p = 0 needs the expected missing count below half a chunk
    k = passes_needed(0.7, 0.0, chunks=680)
    assert 680 * 0.7**k <= 0.5 < 680 * 0.7 ** (k - 1)
