"""What retransmission passes cost: a round-time model fitted to calibration rounds.

``scenarios/benchmark.py`` runs lossless rounds, then *calibration* rounds at a
few losses and a *burst* round at a higher one, and asks whether the burst's
time follows from the lossless round and the calibration. This module is that
model, reading only the run's per-round records (the JSON dicts the server
and workers write) and the loss schedule the benchmark applied; it launches
nothing, so the benchmark is arguments -> run -> :func:`summarize_run` ->
table.

The model (passes from :func:`dblp.protocol.policy.passes_needed`, the one home of
"how many passes does loss L take at tolerance p"): datagrams sent per
direction ``n (1-p) / (1-L)`` (the receiver stops at about ``(1-p) n`` and each
datagram arrives with probability ``1-L``), and

    round(L) = S0 + a [U0 (f_up - 1) + D0 (f_down - 1)] + (k_up - 1 + k_down - 1) o

with ``S0, U0, D0`` the lossless round, up and down times, ``f = sent(L) /
sent(0)``, ``o`` the per-pass overhead (probe -> bitmap -> next pass) and ``a``
the sender's share of a datagram's cost. ``a`` and ``o`` are measured: fitted
to the calibration rounds (:func:`fit_pass_model`). The receiver-bound
extreme (``a = 0``, overhead ``o2``) is predicted beside it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

import numpy as np

from dblp.protocol.policy import passes_needed
from dblp.results.stats import median  # the one median (None and NaN left out); dblp.results.passcost.median is the same

NAN = float("nan")


def fit_pass_model(calib: list[dict], S0: float) -> tuple[float, float, float]:
    """(a, o, o2) from the calibration rounds: ``round - S0 = a * data_term + extra_passes * o``.

    Two or more rounds at different losses: least squares for both ``a`` (the
    sender's share of a datagram's cost, kept in [0, 1]) and ``o``; one
    round: ``a = 1`` (the sender-bound model) and ``o`` from it alone. ``o2``
    is the receiver-bound extreme's overhead (``a = 0``). NaN where nothing
    was measured."""
    rows = [c for c in calib if c["extra_passes"] > 0]
    if not rows:
        return NAN, NAN, NAN
    y = np.array([c["round_s"] - S0 for c in rows])
    x = np.array([c["data_term_s"] for c in rows])
    e = np.array([c["extra_passes"] for c in rows], dtype=float)
    o_r = float(np.dot(y, e) / np.dot(e, e))

    def o_for(a: float) -> float:
        return float(np.dot(y - a * x, e) / np.dot(e, e))

    if len(rows) == 1 or len({round(c["loss"], 6) for c in rows}) == 1:
        return 1.0, o_for(1.0), o_r
    (a, o), *_ = np.linalg.lstsq(np.column_stack([x, e]), y, rcond=None)
    if not 0.0 <= a <= 1.0:
        a = min(1.0, max(0.0, float(a)))
        o = o_for(a)
    return float(a), float(o), o_r


def _span(rs: dict[int, dict]) -> float:
    """A round's span: the first worker's start to the last worker's end."""
    return max(x["t_start"] + x["round_latency_s"] for x in rs.values()) - min(x["t_start"] for x in rs.values())


def summarize_run(
    rounds: dict[int, dict[int, dict]],
    server: Sequence[dict],
    loss_rounds: dict[int, dict],
    *,
    elements: int,
    workers: int,
    lossless: Sequence[int],
    p: float,
    calib_loss: Sequence[float],
    udp: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The benchmark's numbers for one DBLP run.

    ``rounds`` maps round -> worker -> that worker's record, ``server`` is the
    server's records, ``loss_rounds`` maps each lossy round to what was applied
    (``loss``, ``role`` "calib" or "burst", ``t_applied``, ``t_removing``,
    ``dropped``), ``lossless`` the rounds to take the lossless medians over,
    ``p`` the fixed tolerance, ``calib_loss`` the calibration losses (the
    ``calib_*`` columns report the highest), ``udp`` per-host UDP counter
    deltas. ``workers`` scales the aggregate goodput.
    """
    tensor_bits = elements * 4 * 8
    udp = udp or {}
    base = [rounds[r] for r in lossless]
    srv_by_round: dict[int, list[dict]] = {}
    for rec in server:
        srv_by_round.setdefault(rec["round"], []).append(rec)

    def waits(idx: int) -> tuple[float, float]:
        """(time waiting for replies, passes), both directions, averaged over the workers."""
        ws = rounds.get(idx, {}).values()
        ss = srv_by_round.get(idx, [])
        if not ws or not ss:
            return NAN, NAN
        w = statistics.mean(x.get("extra", {}).get("up_wait_reply_s", NAN) for x in ws)
        w += statistics.mean(x.get("extra", {}).get("down_wait_reply_s", NAN) for x in ss)
        return w, statistics.mean(x["up_passes"] for x in ws) + statistics.mean(x["down_passes"] for x in ss)

    base_w = [waits(r) for r in lossless]
    w0, p0 = median([w for w, _ in base_w]), median([q for _, q in base_w])
    spans = [_span(r) for r in base]
    ups = [max(x["up_latency_s"] for x in r.values()) for r in base]
    downs = [max(x["down_latency_s"] for x in r.values()) for r in base]
    goodputs = [tensor_bits / x["up_latency_s"] / 1e9 for r in base for x in r.values()]
    aggregate = [workers * tensor_bits / u / 1e9 for u in ups]
    sent_up0 = median([x["up_sent"] for r in base for x in r.values()])
    sent_down0 = median([s["down_sent"] for rr in lossless for s in srv_by_round.get(rr, [])])
    chunks = base[0][0]["chunks"] if 0 in base[0] else next(iter(base[0].values()))["chunks"]
    S0, U0, D0 = median(spans), median(ups), median(downs)
    out: dict[str, Any] = {
        "dblp_round_s": S0, "dblp_round_min_s": min(spans), "dblp_up_s": U0, "dblp_down_s": D0,
        "dblp_goodput_gbps": median(goodputs), "dblp_aggregate_goodput_gbps": median(aggregate),
        "chunks": chunks, "spans": spans,
        "dblp_up_passes": median([x["up_passes"] for r in base for x in r.values()]),
        "dblp_up_sent_ratio": sent_up0 / chunks,
        "dblp_down_sent_ratio": sent_down0 / chunks,
        "udp_rcvbuf_errors": sum(c.get("RcvbufErrors", 0) for c in udp.values()),
        "udp_counters": udp,
    }

    def data_term(loss: float) -> float:
        need = chunks * (1 - p) if p > 0 else chunks
        f_up = need / (1 - loss) / sent_up0
        f_down = need / (1 - loss) / sent_down0
        return U0 * (f_up - 1) + D0 * (f_down - 1)

    calib: list[dict] = []
    bursts: list[dict] = []
    for idx in sorted(loss_rounds):
        info = loss_rounds[idx]
        rs = rounds[idx]
        s = _span(rs)
        pu = statistics.mean(x["up_passes"] for x in rs.values())
        pdn = statistics.mean(x["down_passes"] for x in srv_by_round[idx]) if srv_by_round.get(idx) else NAN
        end = max(x["t_start"] + x["round_latency_s"] for x in rs.values())
        start = min(x["t_start"] for x in rs.values())
        nxt = rounds.get(idx + 1)
        # the rule must be in place for the whole round and gone before the next one starts
        ok = info["t_applied"] <= start and info.get("t_removing", float("inf")) >= end and (
            nxt is None or info.get("t_removing", 0) <= min(x["t_start"] for x in nxt.values()))
        key = info.get("role", "burst")
        out[f"{key}_timing_ok"] = ok and out.get(f"{key}_timing_ok", True)
        out[f"{key}_dropped_pkts"] = out.get(f"{key}_dropped_pkts", 0) + info.get("dropped", 0)
        w, q = waits(idx)
        row = {"loss": info["loss"], "round_s": s, "passes_up": pu, "passes_down": pdn,
               "extra_passes": (pu - 1) + (pdn - 1), "data_term_s": data_term(info["loss"]), "timing_ok": ok,
               "wait_per_pass_s": (w - w0) / (q - p0) if q - p0 > 0 else NAN}
        (calib if key == "calib" else bursts).append(row)
    for key, rows in (("calib", [c for c in calib if c["loss"] == max(calib_loss, default=-1)]),
                      ("burst", bursts)):
        if rows:  # medians over the repeats (the calib_* columns: the highest calibration loss)
            out[f"{key}_loss"] = rows[0]["loss"]
            out[f"{key}_round_s"] = median([r["round_s"] for r in rows])
            out[f"{key}_passes_up"] = median([r["passes_up"] for r in rows])
            out[f"{key}_passes_down"] = median([r["passes_down"] for r in rows])
    out["burst_rounds_s"] = [r["round_s"] for r in bursts]
    # measured directly: the senders' time between a PROBE and the next pass (or STOP), per extra pass
    out["wait_per_pass_s"] = median([r["wait_per_pass_s"] for r in calib + bursts
                                     if math.isfinite(r["wait_per_pass_s"])])
    a, o, o_r = fit_pass_model(calib, S0)
    out["calib"] = calib
    out["sender_share"] = a
    out["overhead_per_pass_s"] = o
    out["overhead_per_pass_recv_s"] = o_r
    if "burst_loss" in out:
        L = out["burst_loss"]
        k = passes_needed(L, p, chunks)
        pred = S0 + (a if not math.isnan(a) else 1.0) * data_term(L) + (2 * (k - 1)) * (o if not math.isnan(o) else 0.0)
        out["burst_pred_passes"] = k
        out["burst_pred_s"] = pred
        out["burst_err"] = out["burst_round_s"] / pred - 1 if pred > 0 else NAN
        # Second model, for a receiver-bound round: the receiver handles ~(1-p) n datagrams per
        # direction at any loss, so only the extra passes cost time.
        pred_r = S0 + (2 * (k - 1)) * (o_r if not math.isnan(o_r) else 0.0)
        out["burst_pred_recv_s"] = pred_r
        out["burst_err_recv"] = out["burst_round_s"] / pred_r - 1 if pred_r > 0 else NAN
    return out
