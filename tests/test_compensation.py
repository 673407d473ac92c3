"""Loss compensation and the stop rule (dblp.protocol.compensation C1-C6, core R5b), exact values.

Hand-made chunk masks give each estimator its exact arithmetic; the core's receiver is driven
through both stop rules; the sessions are driven in memory for C3/C4 and the composition with
``intersect``; and a real server and workers on loopback show each option end to end.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.protocol.compensation import (BroadcastFeedback, Compensation, UploadFeedback, add_compensation_args,
                                       bounded, chunk_mask_floats, fill_local)
from dblp.protocol.core import Receiver
from dblp.protocol.policy import FixedPolicy, needed_chunks
from dblp.protocol.reduce import reduce_mean_norm
from dblp.transport.server import ServerConfig
from dblp.protocol.session import RecordContext, ServerSession, WorkerSession
from dblp.protocol.wire import ChunkLayout, ParameterError
from procs import free_port
from scripted_loss import run_on_loopback

CF = ChunkLayout(1).chunk_floats


def layout(chunks: int, short: int = 0) -> ChunkLayout:
    return ChunkLayout(chunks * CF - short)


# -- C1: the upload estimate ----------------------------------------------------------------------
def test_unbiased_and_zero_estimates_on_a_hand_made_mask():
    lay = layout(3, short=5)  # three chunks, the last one short
    g = [np.full(lay.elements, v, np.float32) for v in (3.0, 5.0, 11.0)]
    masks = [np.array([True, True, False]), np.array([True, False, False]), np.array([True, True, False])]
    # chunk 0: all three; chunk 1: workers {0, 2}; chunk 2: nobody
    for b, m in zip(g, masks):
        b[chunk_mask_floats(~m, lay)] = 0.0  # what a receiver zero-filled (R7)
    cf = lay.chunk_floats
    out = np.empty(lay.elements, np.float32)
    reduce_mean_norm(g, masks, lay, out, "unbiased")
    assert np.allclose(out[:cf], (3 + 5 + 11) / 3) and np.allclose(out[cf:2 * cf], (3 + 11) / 2)
    assert np.all(out[2 * cf:] == 0)
    reduce_mean_norm(g, masks, lay, out, "zero")
    assert np.allclose(out[:cf], 19 / 3) and np.allclose(out[cf:2 * cf], (3 + 11) / 3)
    assert np.all(out[2 * cf:] == 0)


# -- C2: the local fill ---------------------------------------------------------------------------
def test_local_fill_takes_the_own_contribution_where_the_mean_is_missing():
    lay = layout(4, short=100)
    mean = np.arange(lay.elements, dtype=np.float32)
    own = -np.ones(lay.elements, np.float32)
    held = np.array([True, False, True, False])  # the short last chunk missing too
    out = mean.copy()
    assert fill_local(out, own, held, lay) == 2
    m = chunk_mask_floats(held, lay)
    assert np.array_equal(out[m], mean[m]) and np.all(out[~m] == -1)
    assert int((~m).sum()) == lay.chunk_floats + lay.last_chunk_floats


# -- C3, C5: upload error feedback ----------------------------------------------------------------
def test_upload_feedback_carries_exactly_the_undelivered_chunks_and_is_bounded():
    lay = layout(4)
    fb = UploadFeedback(lay, bound=1.0)
    g1 = np.full(lay.elements, 2.0, np.float32)
    sent = fb.contribution(g1)
    assert np.array_equal(sent, g1)  # nothing carried yet
    fb.delivered(np.array([3, 1]))  # chunks 1 and 3 never handed out
    cf = lay.chunk_floats
    assert np.all(fb.residual[cf:2 * cf] == 2) and np.all(fb.residual[3 * cf:] == 2)
    assert np.all(fb.residual[:cf] == 0) and np.all(fb.residual[2 * cf:3 * cf] == 0)
    g2 = np.ones(lay.elements, np.float32)
    sent = fb.contribution(g2)
    # C5: the residual (norm 2 * sqrt(2 cf)) exceeds 1 x the gradient's norm (sqrt(4 cf)): scaled to it
    assert fb.norm == pytest.approx(float(np.linalg.norm(g2)), rel=1e-6)
    assert np.allclose(sent[cf:2 * cf], 1 + np.sqrt(2)) and np.allclose(sent[:cf], 1)
    assert g1[0] == 2 and g2[0] == 1  # the caller's gradients are never written


def test_bound_leaves_a_small_residual_alone():
    r = np.full(10, 0.5, np.float32)
    assert bounded(r, np.ones(10, np.float32), 1.0) == pytest.approx(np.linalg.norm(np.full(10, 0.5)))
    assert np.all(r == 0.5)


def test_broadcast_feedback_adds_and_carries():
    lay = layout(3)
    fb = BroadcastFeedback(lay, bound=2.0)
    mean = np.full(lay.elements, 1.0, np.float32)
    assert fb.add_to(mean) == 0 and np.all(mean == 1)
    fb.round_over(mean, np.array([False, False, True]))
    mean2 = np.full(lay.elements, 3.0, np.float32)
    fb.add_to(mean2)
    cf = lay.chunk_floats
    assert np.all(mean2[:2 * cf] == 3) and np.all(mean2[2 * cf:] == 4)


# -- the options themselves ------------------------------------------------------------------------
def test_labels_round_trip_and_bad_values_are_refused_by_name():
    c = Compensation("unbiased", "local", "upload", 0.5, "once")
    assert c.label() == "unbiased+fill-local+ef-upload+stop-once"
    assert Compensation.from_label(c.label()) == Compensation("unbiased", "local", "upload", 1.0, "once")
    assert Compensation.from_label("paper") == Compensation() and Compensation().paper
    assert Compensation.from_dict(c.to_dict()) == c
    assert c.flags() == ["--upload-estimate", "unbiased", "--broadcast-fill", "local", "--feedback", "upload",
                         "--stop-rule", "once", "--feedback-bound", "0.5"]
    with pytest.raises(ParameterError, match="'fill-remote' is not a compensation option"):
        Compensation.from_label("unbiased+fill-remote")
    with pytest.raises(ParameterError, match="stop_rule must be one of early, once, deadline, got 'late'"):
        Compensation(stop_rule="late")
    with pytest.raises(ParameterError, match="feedback_bound must be a positive number"):
        Compensation(feedback_bound=0)


def test_the_deadline_rule_has_its_label_flags_and_meta():
    d = Compensation(stop_rule="deadline")
    assert d.label() == "stop-deadline" and not d.paper
    assert Compensation.from_label("stop-deadline") == d
    assert Compensation.from_label("unbiased+fill-local+stop-deadline") == Compensation("unbiased", "local",
                                                                                        stop_rule="deadline")
    assert Compensation.from_dict(d.to_dict()) == d and d.to_dict()["stop_rule"] == "deadline"
    assert d.flags() == ["--stop-rule", "deadline"]
    p = argparse.ArgumentParser()
    add_compensation_args(p)
    assert Compensation.from_args(p.parse_args(d.flags())) == d
    with pytest.raises(ParameterError, match="'stop-late' is not a compensation option; use paper or a '\\+'-joined "
                                             "set of .*stop-once, stop-deadline"):
        Compensation.from_label("stop-late")
    with pytest.raises(ParameterError, match="'stop-once\\+stop-deadline' sets stop_rule twice"):
        Compensation.from_label("stop-once+stop-deadline")


# -- C6: composition with intersect ----------------------------------------------------------------
def test_local_fill_is_refused_under_intersect_and_the_rest_composes():
    lay = layout(10)
    ctx = RecordContext(source="test", policy="baseline", order="blocks")
    with pytest.raises(ParameterError, match="broadcast_fill local conflicts with consistency intersect"):
        WorkerSession(lay, 0, run_id=1, context=ctx, consistency="intersect",
                      compensation=Compensation(broadcast_fill="local"))
    with pytest.raises(ParameterError, match="conflicts with consistency intersect"):
        ServerConfig(port=free_port(), consistency="intersect", compensation=Compensation(broadcast_fill="local"))
    for c in (Compensation("unbiased"), Compensation(feedback="both"), Compensation(stop_rule="once")):
        ServerSession(lay, range(2), policy=FixedPolicy(0.2), run_id=1, context=ctx, consistency="intersect",
                      compensation=c)


# -- core R5b: the stop rule -----------------------------------------------------------------------
def _receiver(rule: str, chunks: int = 100, p: float = 0.4) -> Receiver:
    r = Receiver(layout(chunks), run_id=1, expected_sender=0, direction=ctl.UP, stop_rule=rule)
    r.begin_round(0, None, 0.0, tolerance=p)
    return r


def test_early_stop_cuts_the_first_pass_at_the_threshold():
    r = _receiver("early")
    r.receive_chunks(0, np.arange(60), 0.0)
    assert r.complete and r.received == needed_chunks(100, 0.4) == 60


def test_stop_once_lets_the_first_pass_finish_then_bounds_the_retransmissions():
    r = _receiver("once")
    assert r.stop_count == 100
    r.receive_chunks(0, np.arange(0, 80, 2), 0.0)  # 40 of the first pass's 100 arrive...
    r.receive_chunks(0, np.arange(1, 80, 2), 0.0)  # ... then 80: the threshold (60) holds, no STOP yet
    assert not r.complete and r.received == 80
    r.handle_control(ctl.Probe(0, ctl.UP, 1), 0.0)  # the first pass's PROBE: R5 from here on
    assert r.complete and isinstance(r.control_to_send()[-1], ctl.Stop)
    r2 = _receiver("once")
    r2.receive_chunks(0, np.arange(30), 0.0)  # a burst: 30 of 100 by the PROBE
    r2.handle_control(ctl.Probe(0, ctl.UP, 1), 0.0)
    assert not r2.complete and isinstance(r2.control_to_send()[-1], ctl.Bitmap)
    assert r2.stop_count == 60
    r2.receive_chunks(0, np.arange(30, 60), 0.0)  # the retransmission stops at the bound, mid-pass
    assert r2.complete and r2.received == 60
    r3 = _receiver("once")
    r3.receive_chunks(0, np.arange(100), 0.0)  # everything in: no PROBE needed
    assert r3.complete


# -- the sessions: C3 and C4 over the core's own senders --------------------------------------------
def _round_in_memory(comp: Compensation, grads: list[np.ndarray], p: float, rounds: int = 2):
    """Server and worker sessions over an in-memory lossless link, datagrams handed in send order
    (so the early stop's STOP cuts each transfer at its threshold). Returns each round's results."""
    from dblp.protocol.core import EncodedRound  # noqa: F401  (the sessions encode real values)
    from dblp.protocol.session import ControlToSend, SenderStarted

    lay = ChunkLayout(grads[0].size)
    ctx = RecordContext(source="test", policy="baseline", order="blocks")
    srv = ServerSession(lay, range(len(grads)), policy=FixedPolicy(p), run_id=1, context=ctx, compensation=comp)
    ws = [WorkerSession(lay, i, run_id=1, context=ctx, compensation=comp) for i in range(len(grads))]
    results = []

    def carry(now: float) -> dict[int, object]:
        started = {}
        while (ev := srv.next_event()) is not None:
            if isinstance(ev, ControlToSend):
                ws[ev.worker].handle_control(ev.message, now)
            elif isinstance(ev, SenderStarted):
                started[ev.worker] = ev.sender
        return started

    def transfer(sender, receiver, out: np.ndarray | None) -> None:
        while not sender.done:
            b = sender.datagrams_to_send(0.0, limit=1)
            if b is None:
                for m in sender.control_to_send():
                    receiver.handle_control(m, 0.0)
            else:
                receiver.receive_batch(b.rows, b.lengths, 0.0)
            for m in receiver.control_to_send():
                sender.handle_control(m, 0.0)

    srv.start(0.0)
    carry(0.0)
    for k in range(rounds):
        outs = [np.zeros(lay.elements, np.float32) for _ in ws]
        for i, w in enumerate(ws):
            transfer(w.begin_round(0.0, grads[i], outs[i]), srv.receiver(i), None)
            w.sent(0.0)
        srv.poll(0.0)
        carry(0.0)
        mean = np.zeros(lay.elements, np.float32)
        live = srv.live
        reduce_mean_norm([srv.buffer(w) for w in live], [srv.receiver(w).mask for w in live], lay, mean,
                         comp.upload_estimate)
        reduced = mean.copy()
        srv.broadcast(float(np.linalg.norm(mean)), 0.0, mean)
        senders = carry(0.0)
        for i, w in enumerate(ws):
            transfer(senders[i], w.receiver, outs[i])
        srv.poll(0.0)
        carry(0.0)
        recs = [w.finish_round(0.0) for w in ws]
        results.append((outs, recs, mean.copy(), reduced))
    return results, lay


def test_sessions_apply_fill_local_and_upload_feedback():
    n = 4 * 64  # four order blocks: the early stop's cut falls inside the round
    grads = [np.full(n * CF, float(10 ** i), np.float32) for i in range(3)]
    (r0, r1), lay = _round_in_memory(Compensation(broadcast_fill="local", feedback="upload"), grads, 0.4)
    outs, recs, _, _ = r0
    need = needed_chunks(lay.chunks, 0.4)
    assert all(r.up_received == need and r.down_received == need for r in recs)
    for i, o in enumerate(outs):  # C2: the chunks the broadcast did not bring hold the worker's own value
        per_chunk = o.reshape(lay.chunks, lay.chunk_floats)[:, 0]
        assert np.sum(per_chunk == 10 ** i) >= lay.chunks - need
        assert np.count_nonzero(per_chunk == 0) == 0
        assert recs[i].extra["filled"] == lay.chunks - need
        assert recs[i].extra["compensation"] == "fill-local+ef-upload"
    # C3: round 1 sends the gradient plus round 0's undelivered chunks (bounded at 1x the gradient)
    res = r1[1][0].extra["residual_up_norm"]
    undelivered = lay.chunks - need
    assert res == pytest.approx(np.sqrt(undelivered * CF) * 1.0, rel=1e-5)


def test_sessions_carry_the_broadcast_residual_of_chunks_nobody_was_sent():
    from dblp.protocol.core import DOWN_STREAM, send_order

    n = 4 * 64
    grads = [np.full(n * CF, 1.0, np.float32) for _ in range(2)]
    (r0, r1), lay = _round_in_memory(Compensation(feedback="broadcast", feedback_bound=10.0), grads, 0.4)
    need = needed_chunks(lay.chunks, 0.4)
    sent0 = np.zeros(lay.chunks, bool)  # one broadcast order for every worker: all were sent its first `need`
    sent0[send_order(lay.chunks, "blocks", 0, 0, DOWN_STREAM)[:need]] = True
    assert np.array_equal(r0[2], r0[3])  # round 0 carries nothing yet
    carried = (r1[2] - r1[3]).reshape(lay.chunks, lay.chunk_floats)
    m0 = r0[2].reshape(lay.chunks, lay.chunk_floats)
    assert np.array_equal(carried[~sent0], m0[~sent0])  # C4: round 0's unsent chunks, exactly
    assert np.all(carried[sent0] == 0)
    assert np.any(carried != 0)


# -- end to end over real sockets -------------------------------------------------------------------
ELEMENTS = 362 * 120 + 17
WORKERS = 3
ROUNDS = 3
VALUES = (1.0, 10.0, 100.0)


def _run(comp: Compensation, p: float = 0.3, fast: bool | None = None):
    cfg = ServerConfig(host="127.0.0.1", port=free_port(), workers=WORKERS, policy=FixedPolicy(p), rounds=ROUNDS,
                       compensation=comp, accept_timeout=30, peer_timeout=30, fast=fast)
    return run_on_loopback(cfg, ELEMENTS, ROUNDS, lambda i, k: np.full(ELEMENTS, VALUES[i], np.float32),
                           up_loss=False, fast=fast)


def _subset_means(rule: str) -> set[float]:
    from itertools import combinations

    out = set()
    for r in range(1, 4):
        for s in combinations(VALUES, r):
            out.add(round(sum(s) / (len(s) if rule == "unbiased" else 3), 4))
    return out


def test_paper_rule_over_sockets_leaves_zeros_and_shrunken_chunks():
    outs, recs, srecs = _run(Compensation())
    zeros = sum(int(np.count_nonzero(o == 0)) for per in outs for o in per)
    assert zeros > 0  # the early stop's missing chunks are zero-filled
    allowed = _subset_means("zero") | {0.0}
    assert all({round(float(v), 4) for v in np.unique(o)} <= allowed for per in outs for o in per)
    assert all(r.extra["compensation"] == "paper" for r in srecs)


def test_unbiased_with_local_fill_over_sockets():
    outs, recs, srecs = _run(Compensation("unbiased", "local"))
    paper = _run(Compensation())[0]
    by = {(r.worker, r.round): r for r in recs}
    for i, per in enumerate(outs):
        for k, o in enumerate(per):
            vals = {round(float(v), 4) for v in np.unique(o)}
            # a chunk is a mean over the workers that delivered it (0: none did), or the worker's own value
            assert vals <= _subset_means("unbiased") | {VALUES[i], 0.0}
            filled = by[(i, k)].extra["filled"]
            assert filled == by[(i, k)].chunks - by[(i, k)].down_received > 0
            assert np.count_nonzero(o == VALUES[i]) >= filled * 358 - 358  # the short last chunk aside
            assert np.count_nonzero(o == 0) < np.count_nonzero(paper[i][k] == 0)
    assert all(r.extra["reduce"] == "unbiased" for r in srecs)


def test_stop_once_over_sockets_delivers_everything_without_loss(monkeypatch):
    import dblp.transport.sockets as transport

    monkeypatch.setattr(transport, "RECV_ROWS", 1)  # STOP at exactly the threshold, as in the parity test
    # (on the plain one-datagram path, as there)
    outs, recs, srecs = _run(Compensation(stop_rule="once"), fast=False)  # (the script loses 35% of the broadcast's first pass)
    chunks = recs[0].chunks
    need = needed_chunks(chunks, 0.3)
    assert all(r.up_received == chunks for r in recs)  # lossless uploads: every chunk, none cut by a STOP
    assert all(need <= r.down_received < chunks for r in recs)  # the lossy broadcast: the bound, on retransmission
    exact = round(sum(VALUES) / 3, 4)
    assert all({round(float(v), 4) for v in np.unique(o)} <= {exact, 0.0} for per in outs for o in per)
    early = _run(Compensation(), fast=False)
    assert all(r.up_received == need for r in early[1])  # the paper's early stop cuts the lossless uploads


# -- the training exchange (the in-memory model) drives the same options ---------------------------
def _exchange(label: str, p: float, loss: float = 0.0, workers: int = 3):
    import torch

    from dblp.train.exchange import TolerancePolicyExchange

    ex = TolerancePolicyExchange.fixed(p, seed=1, compensation=label, loss=loss)
    grads = [torch.full((CF * 200,), float(10 ** i)) for i in range(workers)]
    out = ex.exchange_group(grads)
    return ex, out.numpy().reshape(200, CF)[:, 0]


def test_exchange_paper_mode_loses_the_early_stop_share_even_without_loss():
    ex, per_chunk = _exchange("paper", 0.4)
    need = needed_chunks(200, 0.4)
    info = ex.last_info()
    assert info["up_dropped"] == 3 * (200 - need) and info["down_dropped"] == 200 - need
    assert np.count_nonzero(per_chunk == 0) >= 200 - need  # zero-filled where the broadcast stopped


def test_exchange_stop_once_manufactures_no_loss_and_bounds_real_loss():
    ex, per_chunk = _exchange("stop-once", 0.4)
    assert ex.last_info()["up_dropped"] == 0 and ex.last_info()["down_dropped"] == 0
    assert np.allclose(per_chunk, 111 / 3)
    ex, _ = _exchange("stop-once", 0.4, loss=0.7)  # a burst: the bound holds on the retransmission
    assert ex.last_info()["down_dropped"] == 200 - needed_chunks(200, 0.4)


def test_exchange_takes_the_deadline_rule_as_once():
    """The in-memory link has no network time: no pass outlasts its deadline, every step as once."""
    import torch

    from dblp.train.exchange import TolerancePolicyExchange

    for loss in (0.0, 0.3, 0.7):
        runs = {}
        for label in ("stop-once", "stop-deadline"):
            ex = TolerancePolicyExchange.fixed(0.4, seed=1, compensation=label, loss=loss)
            steps = []
            for k in range(3):  # later steps: every receiver has its (zero-time) estimate
                grads = [torch.full((CF * 200,), float(10 ** i + k)) for i in range(3)]
                out = ex.exchange_group(grads).numpy().copy()
                info = ex.last_info()
                steps.append((out, info["up_dropped"], info["down_dropped"]))
            runs[label] = steps
        for (o1, u1, d1), (o2, u2, d2) in zip(runs["stop-once"], runs["stop-deadline"]):
            assert np.array_equal(o1, o2) and (u1, d1) == (u2, d2)
        want_down = {0.0: 0, 0.3: 60, 0.7: 200 - needed_chunks(200, 0.4)}[loss]
        assert [d for _, _, d in runs["stop-deadline"]] == [want_down] * 3


def test_exchange_unbiased_with_local_fill_leaves_no_zero_chunk():
    ex, per_chunk = _exchange("unbiased+fill-local", 0.4)
    allowed = {1.0, 10.0, 100.0, 5.5, 50.5, 55.0, 37.0}  # unbiased subset means, or worker 0's own 1.0
    assert {float(v) for v in np.unique(per_chunk)} <= allowed | {0.0}
    assert ex.last_info()["filled"] == 200 - needed_chunks(200, 0.4)
    assert ex.last_info()["compensation"] == "unbiased+fill-local"


# -- the answer table -------------------------------------------------------------------------------
def test_answer_verdicts_compare_against_the_baseline_seed_range():
    from dblp.results.tta import answer_rows, verdict_lines

    def row(run, seed, t):
        return {"condition": "bursts", "run": run, "seed": seed, "metric": "accuracy", "passes_at_bursts": 3.0,
                "burst_round_s": 0.5, "round_mean_s": 0.2, "train_s": 30.0, "final": 0.95, "divergence": 0.01,
                "to_0.94_s": t, "to_0.94_iter": t * 2}

    rows = [row("baseline", s, t) for s, t in enumerate((20.0, 22.0, 24.0))]
    rows += [row("dblp", s, t) for s, t in enumerate((25.0, 27.0, 30.0))]
    rows += [row("dblp-x", s, t) for s, t in enumerate((10.0, 12.0, 21.0))]
    rows += [row("dblp-y", s, t) for s, t in enumerate((10.0, 12.0, 15.0))]
    table = answer_rows(rows, [0.94])
    assert table[1][:3] == ["bursts", "baseline", 3]
    assert "22.0 [20.0-24.0]" in table[1]
    v = verdict_lines(rows, [0.94])
    assert "dblp LATER than the baseline beyond the seed spread (0.81x the baseline's speed" in v[0]
    assert "dblp-x inside the seed spread" in v[1]
    assert "dblp-y SOONER than the baseline beyond the seed spread (1.83x" in v[2]
