"""Shared helpers of the simulator tests: configurations and the analytic round time."""

from __future__ import annotations

import numpy as np

from dblp.protocol import control as ctl
from dblp.protocol.policy import needed_chunks, passes_needed
from dblp.sim import SimConfig
from dblp.sim.network.net import ctrl_wire_bytes

SMALL = 200_000  # 553 chunks: small enough for the packet level


def small(**kw) -> SimConfig:
    base = dict(model=SMALL, workers=3, rounds=20, policy="dblp", freq=5)
    base.update(kw)
    return SimConfig(**base)


def worker_mean(records, attr: str, rounds=None) -> float:
    v = [getattr(r, attr) for r in records if r.role == "worker" and (rounds is None or r.round in rounds)]
    return float(np.mean(v))


def ctrl_delay(cfg: SimConfig, msg: ctl.Message, nic_bps: float, port_bps: float) -> float:
    wire = ctrl_wire_bytes(len(ctl.encode(msg)))
    return wire * 8 / nic_bps + cfg.delay_s + wire * 8 / port_bps + cfg.delay_s + cfg.ctrl_overhead_s


def analytic_round_s(cfg: SimConfig, tolerance: float) -> float:
    """Steady-state round time with no loss and no queueing, from first principles.

    Upstream: every worker sends need datagrams one host interval apart and
    the last one crosses two links; the server then broadcasts to N workers
    from one host (N*need intervals for the last worker, which is the one the
    next round waits for); the next upstream starts when the worker's STOP
    has reached the server and the server's ROUND has come back.
    """
    n = cfg.layout.chunks
    need = needed_chunks(n, tolerance)
    wire = cfg.wire_bytes
    h_w = max(1 / cfg.send_pps, wire * 8 / cfg.bandwidth_bps)
    h_s = max(1 / cfg.server_pps, wire * 8 / cfg.server_rate_bps)
    p_up = cfg.delay_s + wire * 8 / cfg.server_rate_bps + cfg.delay_s
    p_down = cfg.delay_s + wire * 8 / cfg.bandwidth_bps + cfg.delay_s
    c_stop = ctrl_delay(cfg, ctl.Stop(1, ctl.DOWN, need), cfg.bandwidth_bps, cfg.server_rate_bps)
    c_round = ctrl_delay(cfg, ctl.RoundStart(1, ctl.UP, tolerance, False), cfg.server_rate_bps, cfg.bandwidth_bps)
    assert tolerance == 0 or cfg.workers == 1, "early stops of a shared host are not in this formula"
    return need * h_w + cfg.workers * need * h_s + p_up + p_down + c_stop + c_round + cfg.compute_s


def passes_for(p: float, burst: float) -> int:
    """Passes until 1 - burst^k >= 1 - p (dblp.protocol.policy.passes_needed, the one form)."""
    return passes_needed(burst, p)