"""What a replayed run's records say about its loss: datagram loss per direction and per round, and
the plot of each iteration's latency beside the loss it saw.

A trace replay (:mod:`emulation.replay`) knows what it *requested* and what its rules dropped; the
round records (:mod:`dblp.protocol.records`) know what the protocol *saw*: datagrams sent against datagrams
that reached the other side. ``scenarios/trace_replay.py`` reports both; for a packets trace
(``*.pkts``, no clock) the records' loss per round is the only per-iteration figure there is.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["datagram_loss", "datagram_loss_by_round", "plot_loss"]


def datagram_loss(records, t_from: float | None = None, t_to: float | None = None) -> dict:
    """Datagram loss per direction measured from a run's RoundRecords (both sides' files).

    Upstream: what workers sent (``up_sent``, retransmissions included) minus
    what reached the server (accepted + duplicates + stale, from the server's
    records), over what was sent; downstream likewise (server ``down_sent``
    vs workers' receivers). Exact for a reliable run (every datagram sent is
    needed until delivered); for a bounded-loss run, datagrams still in flight
    when STOP arrives count as lost, so it overestimates there. Rounds whose
    ``t_start`` lies outside [t_from, t_to] are ignored.
    """
    def keep(r) -> bool:
        return (t_from is None or r.t_start >= t_from) and (t_to is None or r.t_start <= t_to)

    srv = {(r.round, r.worker): r for r in records if r.role == "server" and keep(r)}
    wrk = {(r.round, r.worker): r for r in records if r.role == "worker" and keep(r)}
    both = sorted(set(srv) & set(wrk))
    up_sent = sum(wrk[k].up_sent for k in both)
    up_got = sum(srv[k].up_received + srv[k].duplicate + srv[k].stale for k in both)
    dn_sent = sum(srv[k].down_sent for k in both)
    dn_got = sum(wrk[k].down_received + wrk[k].duplicate + wrk[k].stale for k in both)
    tot_sent, tot_got = up_sent + dn_sent, up_got + dn_got
    return {
        "rounds": len({k[0] for k in both}),
        "up": {"sent": up_sent, "delivered": up_got, "loss": 1 - up_got / up_sent if up_sent else float("nan")},
        "down": {"sent": dn_sent, "delivered": dn_got, "loss": 1 - dn_got / dn_sent if dn_sent else float("nan")},
        "loss": 1 - tot_got / tot_sent if tot_sent else float("nan"),
    }


def datagram_loss_by_round(records) -> dict[int, float]:
    """Per round, the datagram loss of both directions measured from the records, as
    :func:`datagram_loss` counts it (sent - delivered over sent). Why: a packets trace (``*.pkts``)
    has no clock, so there is no schedule to average over each round's span; what the records saw
    is the per-iteration loss that can be plotted beside the latency."""
    srv = {(r.round, r.worker): r for r in records if r.role == "server"}
    wrk = {(r.round, r.worker): r for r in records if r.role == "worker"}
    sent: dict[int, int] = {}
    got: dict[int, int] = {}
    for k in set(srv) & set(wrk):
        s, w = srv[k], wrk[k]
        sent[k[0]] = sent.get(k[0], 0) + w.up_sent + s.down_sent
        got[k[0]] = got.get(k[0], 0) + s.up_received + s.duplicate + s.stale + w.down_received + w.duplicate + w.stale
    return {k: 1 - got[k] / n for k, n in sorted(sent.items()) if n}


def plot_loss(runs: dict[str, list], loss: dict[str, dict[int, float]], path: str | Path, tname: str,
              what: str = "replayed loss") -> Path:
    """Per iteration: each run's latency (top) and the loss it saw (bottom: ``loss``, run -> round ->
    fraction; the replayed schedule's mean over the round for a segments trace, the records' measured
    loss for a packets trace - ``what`` says which), plain tick labels on both axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    from dblp.results import analysis

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for label, recs in runs.items():
        r, v = analysis.per_round(recs)
        color = analysis.RUN_COLORS.get(label)
        ax1.plot(r, v * 1e3, lw=1.0, label=label, color=color)
        ex = loss.get(label, {})
        ks = sorted(ex)
        ax2.plot(ks, [ex[k] * 100 for k in ks], lw=1.0, label=label, color=color)
    ax1.set_ylabel("latency (ms, slowest worker)")
    ax1.set_yscale("log")
    analysis.plain_log_ticks(ax1.yaxis)
    ax1.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=8)
    ax1.set_title(f"Latency and the loss each iteration saw, trace {tname}", fontsize=10)
    ax2.set_xlabel("iteration")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.yaxis.set_major_formatter(PercentFormatter(decimals=None))
    ax2.set_ylabel(f"{what}\nduring the iteration", fontsize=9)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
