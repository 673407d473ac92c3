"""Simulator parameters from an emulation (or real-host) run's results folder.

``python -m dblp.sim calibrate RESULTS_DIR -o params.json`` reads

* the round records (``records/*.jsonl`` as :class:`emulation.recorder.RunRecorder`
  writes them, else :func:`dblp.results.runfolder.record_files`: ``rounds.jsonl``,
  else every other ``*.jsonl`` or ``*.jsonl.gz`` below the folder; lines that
  are not round records are skipped and counted; with records of several
  sources, the most frequent non-simulation one),
* ``config.json`` there or in the folder above (a policy's subfolder of a
  recorder's run folder) if there is one (link rate ``bw`` in Mbit/s, ``delay``,
  ``buffer_pkts``/``buffer_bytes``, ``workers``, ``model``/``elements``,
  policy flags... looked up by name anywhere in it, nested dicts included),
* ``bursts.jsonl`` if there is one (the burst schedule actually applied),

and writes a :class:`~dblp.sim.config.SimConfig` that reproduces the run:

==========================  ===================================================
parameter                   estimate
==========================  ===================================================
``bandwidth_bps``           config's ``bw``; else the bytes a worker sends per
                            second of send latency in lossless rounds (one
                            pass, no burst), times the workers sharing the
                            server's link
``send_pps``                a host cost, with the links and the pacing as
                            known terms: the per-datagram time of those rounds
                            (send latency / datagrams sent) is compared with
                            a simulation of the run's network whose hosts
                            never bind; more than ``HOST_MARGIN`` (10%) slower:
                            the host binds, 1 / that time; else the run does
                            not show the host's cost and the base's rate is
                            kept (never the run's link or pacing rate)
``server_send_pps``         the same for the broadcast: the server's slowest
                            per-worker broadcast time / datagrams it sent to
                            all workers in that round (a round where one of
                            its flows took one pass; none such: every quiet
                            round); then the binding rates are
                            rescaled until a simulation with them shows the
                            same per-datagram times (``--no-refine``: not,
                            and the network alone is the links' and pacers'
                            frame time)
``recv_cost_s``,            the receive part of a binding host's datagram cost
``server_recv_cost_s``      (a worker's per broadcast datagram, the server's
                            per upload datagram): a lossless round gives send
                            + receive, a burst round send + receive x (1 -
                            loss); the share is bisected in simulation until
                            the burst rounds' per-datagram time matches; 0
                            where the host does not bind, there are no burst
                            rounds, or they are no faster (``--no-refine``: 0)
``compute_s``               median gap between a worker's round end and its
                            next round's start
``reduce_s``                median over rounds of the shortest wait of a
                            worker between its STOP and the broadcast's ROUND
``norms``                   the server records' ``grad_norm`` per round, with
                            the zero-fill effect of lost chunks divided out
                            (see ``norm_model`` in :mod:`dblp.sim.model`)
policy, tolerances          the records' ``policy`` and tolerances
``loss``                    ``bursts.jsonl``'s iteration and timed bursts
==========================  ===================================================

Every estimate, and how many rounds it came from, is stored under
``"_calibration"`` in the output (ignored when the file is read back);
``estimates.host`` says for each host what was measured (per-datagram time,
the network alone, binding or not, the rate), the per-round overheads, and
on which machine (the run's ``config.json`` ``_run``: host name, cores, load
average, date, code commit; and the calibration's own), and the receive
part (``receive_s``, ``receive``: fitted or why not). Not measured: the
control overhead (``ctrl_overhead_s``, the base's) and the sender's batching
(``wake_s``: 0, exact timers).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from traces.units import HelpFormatter, UnitError, parse_duration

from dblp.runs.gradients import model_elements
from dblp.protocol.policy import DEFAULT_ETA, DEFAULT_FREQ
from dblp.cli.provenance import run_values
from dblp.protocol.records import RoundRecord, read_records
from dblp.results.runfolder import record_files
from dblp.results.stats import median
from dblp.protocol.wire import TAG_SIZE, ChunkLayout, ParameterError
from dblp.sim.config import SimConfig


def load_run(folder: str | Path) -> tuple[list[RoundRecord], dict, list[dict], dict]:
    """Records (deduplicated), config.json, bursts.jsonl events, and reading notes."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ParameterError(f"{folder}: not a results folder")
    own = sorted((folder / "records").glob("*.jsonl")) if (folder / "records").is_dir() else []
    files = own or record_files(folder)  # one recorder's processes, else what the analyses read
    skipped = [0]
    allrecs = [r for f in files for r in read_records(f, skipped=skipped)]
    sources = sorted({r.source for r in allrecs})
    source = None
    if len(sources) > 1:  # one view per calibration: the most frequent, simulation last
        counts = {s: sum(1 for r in allrecs if r.source == s) for s in sources}
        source = max(sources, key=lambda s: (s != "simulation", counts[s]))
        allrecs = [r for r in allrecs if r.source == source]
    seen: dict[tuple, RoundRecord] = {}
    for r in allrecs:
        seen.setdefault((r.role, r.worker, r.round), r)
    recs = sorted(seen.values(), key=lambda r: (r.round, r.role, r.worker))
    if not recs:
        raise ParameterError(f"{folder}: no round records found in {[str(f) for f in files] or '*.jsonl'}")
    config: dict = {}
    machine: Any = None  # the run's machine facts (config.json's _run); a policy's own config.json has none
    for p in (folder / "config.json", folder.parent / "config.json"):
        try:
            machine = machine or json.loads(p.read_text(encoding="utf-8")).get("_run")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
    config_path = next((p for p in (folder / "config.json", folder.parent / "config.json") if p.exists()), None)
    if config_path is not None:  # a policy's subfolder of a RunRecorder folder: the run's config is above
        try:
            c = json.loads(config_path.read_text(encoding="utf-8"))
            config = run_values(c) if isinstance(c, dict) else {}  # the values the run used, not its flags' text
        except (OSError, json.JSONDecodeError):
            config = {}
    if isinstance(machine, dict):
        config["_run"] = machine
    bursts: list[dict] = []
    if (folder / "bursts.jsonl").exists():
        bursts = [e for e in _jsonl(folder / "bursts.jsonl") if isinstance(e, dict)]
    notes = {"record_files": [str(f) for f in files], "records": len(recs), "skipped_lines": skipped[0],
             "config": str(config_path) if config else None, "burst_events": len(bursts)}
    if source is not None:
        notes["record_source"] = f"{source} (of {sources})"
    return recs, config, bursts, notes


def _jsonl(path: Path) -> list:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _find(d: Any, *names: str) -> Any:
    """The first value under any of ``names``, searching nested dicts breadth-first."""
    queue = [d]
    while queue:
        x = queue.pop(0)
        if isinstance(x, dict):
            for n in names:
                if n in x and x[n] is not None and not isinstance(x[n], dict):
                    return x[n]
            queue.extend(v for k, v in x.items() if isinstance(v, dict) and not str(k).startswith("_"))
    return None


def _time_s(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return parse_duration(str(v))  # a bare number: seconds
    except UnitError:
        return None


def calibrate(folder: str | Path, *, base: SimConfig | None = None, refine: bool = True) -> tuple[SimConfig, dict]:
    recs, conf, bursts, notes = load_run(folder)
    base = base or SimConfig()
    est: dict[str, Any] = {}
    wk = [r for r in recs if r.role == "worker"]
    sv = [r for r in recs if r.role == "server"]
    if not wk:
        raise ParameterError(f"{folder}: no worker records (role=worker); cannot calibrate")
    workers = int(_find(conf, "workers", "n_workers") or len({r.worker for r in wk}))
    chunks = max(r.chunks for r in recs)
    rounds = len({r.round for r in wk})
    mtu = int(_find(conf, "mtu") or base.mtu)
    model = _find(conf, "elements", "model")
    if model is None:
        model = chunks * ChunkLayout(1, mtu).chunk_floats
        est["model"] = f"{model} elements from {chunks} chunks per round"
    d: dict[str, Any] = {"workers": workers, "rounds": rounds, "mtu": mtu, "model": model}
    # the run's data wire, from its chunk count: authenticated runs carry 358 floats a chunk, the paper's 362
    elements = model_elements(int(model) if isinstance(model, float) else model)
    if "model" not in est and chunks == ChunkLayout(elements, mtu, key=bytes(TAG_SIZE)).chunks \
            != ChunkLayout(elements, mtu).chunks:
        d["wire"] = 2
    # -- policy ------------------------------------------------------------------------
    policy = next((r.policy for r in sv + wk if r.policy), "") or base.policy
    d["policy"] = policy
    tols = sorted({r.tolerance_down for r in sv} | {r.tolerance_up for r in wk})
    if policy == "baseline":  # RoundRecord reads the older "fixed" as "baseline"
        d["p"] = float(tols[0]) if tols else base.p
    elif policy == "dblp" and tols:
        d["p_low"], d["p_high"] = float(tols[0]), float(tols[-1])
        d["p"] = float(tols[0])
    d["eta"] = float(_find(conf, "eta") or DEFAULT_ETA)
    d["freq"] = int(_find(conf, "freq", "dblp_freq") or DEFAULT_FREQ)
    for key in ("order", "seed"):
        v = _find(conf, key)
        if v is not None:
            d[key] = v
    # -- network -------------------------------------------------------------------------
    bw = _find(conf, "bandwidth_bps")
    if bw is None:
        mbps = _find(conf, "bw", "bw_mbps", "bandwidth_mbps")
        bw = float(mbps) * 1e6 if mbps is not None else None
    sbw = _find(conf, "server_bandwidth_bps")
    if sbw is None:
        smbps = _find(conf, "server_bw", "server_bw_mbps")
        sbw = float(smbps) * 1e6 if smbps is not None else None
    delay = _time_s(_find(conf, "delay_s", "delay"))
    if delay is not None:
        d["delay_s"] = delay
    qb = _find(conf, "queue_bytes", "buffer_bytes")
    qp = _find(conf, "buffer_pkts", "queue_pkts")
    wire = ChunkLayout(1, mtu).datagram_size + base.frame_overhead_bytes
    if qb is not None:
        d["queue_bytes"] = int(qb)
    elif qp is not None:
        d["queue_bytes"] = int(qp) * wire
    d.update(_topology(conf))
    rate = _find(conf, "send_rate_bps")
    if rate is None:
        r0 = next((r.send_rate_bps for r in wk if r.send_rate_bps), None)
        rate = r0
    if rate:
        d["send_rate_bps"] = float(rate)
    # lossless rounds: one pass, no burst - upstream and broadcast each on its own, since behind a
    # slow link (a leaf-spine uplink, the server's own NIC) one direction may lose in every round
    burst_rounds = _burst_rounds(bursts)
    quiet = {r.round for r in wk if not r.extra.get("burst") and r.round not in burst_rounds} - {0}  # 0: start-up
    up_clean = quiet & {r.round for r in wk if r.up_passes == 1}
    # a broadcast's time, measured again in the refinement's simulation of the same network, holds
    # whatever passes that network costs; single-pass ones where there are any, else all quiet rounds
    down_clean = (quiet & {r.round for r in sv if r.down_passes == 1}) or quiet
    clean = up_clean & down_clean
    est["lossless_rounds"] = len(clean)
    est["lossless_broadcasts"] = len(down_clean)
    h_w, h_s = _datagram_times(recs, up_clean, down_clean)
    by_round: dict[int, list[RoundRecord]] = {}
    for r in sv:
        by_round.setdefault(r.round, []).append(r)
    if h_w is None:
        raise ParameterError(f"{folder}: no lossless rounds (one pass, no burst) to measure the send rate from")
    if bw is None:
        bw = workers * wire * 8.0 / h_w
        est["bandwidth_bps"] = f"{bw:.4g} bit/s: {workers} workers x one datagram per {h_w * 1e6:.2f} us"
    d["bandwidth_bps"] = float(bw)
    if sbw is not None:
        d["server_bandwidth_bps"] = float(sbw)
    est["worker_datagram_s"] = h_w
    if h_s is not None:
        est["server_datagram_s"] = h_s
    # -- compute and reduce --------------------------------------------------------------
    gaps = []
    for w in {r.worker for r in wk}:
        mine = sorted((r for r in wk if r.worker == w), key=lambda r: r.round)
        for a, b in zip(mine, mine[1:]):
            if b.round == a.round + 1:
                gaps.append(b.t_start - (a.t_start + a.round_latency_s))
    c = median(gaps, finite=True, empty=None)
    d["compute_s"] = max(0.0, c) if c is not None else 0.0
    waits: dict[int, list[float]] = {}
    for r in wk:
        v = r.extra.get("wait_server_s")
        if isinstance(v, (int, float)):
            waits.setdefault(r.round, []).append(float(v))
    red = median([min(v) for k, v in waits.items() if k in (clean or up_clean)], finite=True, empty=None)
    if red is not None:
        ctrl = 2 * d.get("delay_s", base.delay_s) + base.ctrl_overhead_s
        d["reduce_s"] = max(0.0, red - ctrl)
    # -- norms -----------------------------------------------------------------------------
    norms = []
    for k in sorted(by_round):
        rs = by_round[k]
        g = rs[0].grad_norm
        fr = sum(x.up_received for x in rs) / chunks if chunks else 0.0
        if g is None or not math.isfinite(g) or fr <= 0:
            norms.append(norms[-1] if norms else 1.0)
        elif base.norm_model == "received":
            norms.append(g * workers / math.sqrt(fr))
        else:
            norms.append(g)
    if norms and len(norms) >= rounds:
        d["norms"] = [float(x) for x in norms]
        est["norms"] = f"{len(norms)} grad_norm values from the server records"
    else:
        est["norms"] = "no server grad_norm per round: synthetic norms"
    # -- loss ------------------------------------------------------------------------------
    loss = _burst_specs(bursts)
    if not loss and _find(conf, "loss") is not None and isinstance(_find(conf, "loss"), (int, float)):
        loss = [{"kind": "bernoulli", "p": float(_find(conf, "loss"))}]
    d["loss"] = loss
    cfg = SimConfig.from_dict({**base.to_dict(), **d, "send_pps": UNBOUNDED_PPS, "server_send_pps": UNBOUNDED_PPS})
    cfg, host = _host_costs(cfg, base, h_w, h_s, up_clean, down_clean, refine, est)
    ctrl_how = "not measured: the base's value"
    if refine:
        ctrl, ctrl_how = _control_overhead(cfg, recs, burst_rounds)
        if ctrl != cfg.ctrl_overhead_s:  # the host costs again, with the run's pass overhead as a known term
            # (and the reduce time, measured as the wait from a STOP to the next ROUND, holds one overhead)
            cfg = cfg.with_(ctrl_overhead_s=ctrl, send_pps=UNBOUNDED_PPS, server_send_pps=UNBOUNDED_PPS,
                            reduce_s=max(0.0, cfg.reduce_s + cfg.ctrl_overhead_s - ctrl))
            cfg, host = _host_costs(cfg, base, h_w, h_s, up_clean, down_clean, refine, est)
        cfg = _receive_costs(cfg, recs, burst_rounds, host)
    host["per_round"] = {"compute_s": cfg.compute_s, "reduce_s": cfg.reduce_s,
                         "ctrl_overhead_s": cfg.ctrl_overhead_s, "ctrl_overhead": ctrl_how}
    host["machine"] = _machine(conf)
    est["host"] = host
    notes.update(estimates=est)
    return cfg, notes


#: a host whose cost the run does not show is simulated at this rate meanwhile (a datagram per ns: never binding)
UNBOUNDED_PPS = 1e9
#: a host is taken to bind when its per-datagram time exceeds what the network and pacing alone give by this much
HOST_MARGIN = 0.10


def _host_costs(cfg: SimConfig, base: SimConfig, h_w: float, h_s: float | None, up_clean: set[int],
                down_clean: set[int], refine: bool, est: dict) -> tuple[SimConfig, dict]:
    """The hosts' per-datagram send costs, with the network and the pacing as known terms.

    A lossless round's per-datagram time is the slowest of the host's send cost, the sender's pacing
    and its share of the links. Taking it as the host's cost (as this module did) makes the host
    constant the run's link or pacing rate (94% of the link's frame rate in the calibration runs), which
    then caps any faster network. So the run's own network is simulated first with hosts that never
    bind; only where the measured time exceeds that by more than :data:`HOST_MARGIN` is the host
    binding, and its cost is fitted (matched in simulation, :func:`_refine`). Where it does not, the
    run shows only a bound (the host is at least that fast): the base's rate is kept and the
    calibration says so, so no link or pacing rate turns into a host constant."""
    if refine:
        sim_w, sim_s = _simulated_times(cfg, up_clean, down_clean)
    else:  # no simulation asked for: the analytic floor of the worker's own link and pacing
        sim_w, sim_s = None, None
    wire_bits = cfg.wire_bytes * 8.0
    floor_w = max(wire_bits / cfg.bandwidth_bps, wire_bits / cfg.send_rate_bps if cfg.send_rate_bps else 0.0)
    floor_s = wire_bits / cfg.server_rate_bps
    net_w = max(floor_w, sim_w or 0.0)
    net_s = max(floor_s, sim_s or 0.0)
    host: dict[str, Any] = {}
    upd: dict[str, float] = {}
    for who, h, net, key, kept in (("worker", h_w, net_w, "send_pps", base.send_pps),
                                   ("server", h_s, net_s, "server_send_pps", base.server_pps)):
        bound = h is not None and h > net * (1 + HOST_MARGIN)
        upd[key] = 1.0 / h if bound else kept
        host[who] = {"measured_datagram_s": h, "network_alone_datagram_s": net, "binding": bound,
                     "datagrams_per_s": upd[key],
                     "how": (f"fitted: {h * 1e6:.2f} us a datagram against {net * 1e6:.2f} us from the links "
                             "and pacing alone" if bound else
                             ("not shown by this run: " + (f"{h * 1e6:.2f} us a datagram, the links and pacing "
                                                           f"alone {net * 1e6:.2f} us (the host is at least "
                                                           f"{1 / h:,.0f} datagrams/s)" if h else "no broadcast "
                                                           "times") + f"; the base's {kept:,.0f} datagrams/s kept"))}
    cfg = cfg.with_(**upd)
    fit_w, fit_s = host["worker"]["binding"], host["server"]["binding"]
    if refine and (fit_w or fit_s):
        cfg = _refine(cfg, h_w if fit_w else None, h_s if fit_s else None, up_clean, down_clean, est)
        host["worker"]["datagrams_per_s"], host["server"]["datagrams_per_s"] = cfg.send_pps, cfg.server_pps
    return cfg, host


#: the receive part's share of a datagram's cost is fitted to this many bisection steps (1/2^8 of the cost)
RECV_STEPS = 8
#: the largest share of a datagram's cost the receive part may take (the send part is never free)
RECV_MAX_SHARE = 0.95


def _reply_wait(recs: list[RoundRecord], rounds: set[int]) -> float | None:
    """Median wait per pass for the pass's reply (PROBE -> BITMAP, or the STOP) in the multi-pass
    transfers of ``rounds``, both directions (the records' ``up_wait_reply_s`` / ``down_wait_reply_s``)."""
    waits = []
    for r in recs:
        if r.round not in rounds:
            continue
        for key, passes in (("up_wait_reply_s", r.up_passes), ("down_wait_reply_s", r.down_passes)):
            v = r.extra.get(key)
            if isinstance(v, (int, float)) and passes > 1 and ((r.role == "worker") == (key[0] == "u")):
                waits.append(float(v) / passes)
    return median(waits, finite=True, empty=None)


def _control_overhead(cfg: SimConfig, recs: list[RoundRecord], burst_rounds: set[int]) -> tuple[float, str]:
    """The processing a control message costs (``ctrl_overhead_s``), from the run's burst rounds: every
    pass there waits for its reply (a PROBE out, a BITMAP back: two messages), and the measured wait per
    pass, less the simulated one at the current overhead, is two overheads more (every control message
    then costs it, in lossless rounds too). Why: on the emulator a reply took 6.2-7.4 ms a pass (median;
    2 Gbit/s star, load 6-9) against 0.23 ms simulated with the base's 20 us; over a burst round's 14
    passes that is ~90 ms the round level did not have, and the receive part fitted from burst rounds
    (:func:`_receive_costs`) would otherwise absorb it. The base's value where the run has
    no multi-pass burst transfers or shows less."""
    from dblp.sim.model import simulate

    meas = _reply_wait(recs, burst_rounds)
    if meas is None:
        return cfg.ctrl_overhead_s, "not measured (no multi-pass transfers in burst rounds): the base's value"
    trial = cfg.with_(rounds=min(cfg.rounds, 60), fidelity="round")
    sim = _reply_wait(simulate(trial).records, {k for k in burst_rounds if k < trial.rounds})
    if sim is None or meas <= sim:
        return cfg.ctrl_overhead_s, (f"the base's value: burst rounds' replies {meas * 1e3:.3f} ms a pass, "
                                     f"simulated {0 if sim is None else sim * 1e3:.3f} ms")
    ctrl = cfg.ctrl_overhead_s + (meas - sim) / 2.0
    return ctrl, (f"fitted: {meas * 1e3:.3f} ms a pass for the reply in burst rounds against {sim * 1e3:.3f} ms "
                  f"simulated at {cfg.ctrl_overhead_s * 1e6:.0f} us a message; two messages a pass")


def _broadcast_datagram_time(recs: list[RoundRecord], rounds: set[int]) -> float | None:
    """Median per-datagram time of the broadcast in ``rounds``: a round's slowest flow over all the
    server sent in it (its streams leave one host together, so their datagrams share its time)."""
    by_round: dict[int, list[RoundRecord]] = {}
    for r in recs:
        if r.role == "server" and r.round in rounds:
            by_round.setdefault(r.round, []).append(r)
    return median([max(x.down_latency_s for x in rs) / sum(x.down_sent for x in rs)
                    for rs in by_round.values() if sum(x.down_sent for x in rs) > 0], finite=True, empty=None)


def _burst_times(recs: list[RoundRecord], rounds: set[int]) -> tuple[float | None, float | None]:
    """Median per-datagram time of the uploads (per worker record) and of the broadcast (the server's
    slowest flow / all it sent) in the iteration-burst rounds ``rounds``: all passes, as they came."""
    h_w = median([r.up_latency_s / r.up_sent for r in recs
                   if r.role == "worker" and r.round in rounds and r.up_sent > 0], finite=True, empty=None)
    return h_w, _broadcast_datagram_time(recs, rounds)


def _receive_costs(cfg: SimConfig, recs: list[RoundRecord], burst_rounds: set[int], host: dict) -> SimConfig:
    """Split a binding host's per-datagram cost into a send part and a receive part (the receiving
    host's cost of a delivered datagram: ``server_recv_cost_s`` for the uploads, ``recv_cost_s`` for
    the broadcast), from two equations of the same run: a lossless round gives send + receive (the
    rate fitted by :func:`_host_costs`), a burst round, whose loss drops a known share of the
    datagrams before the receiver, send + receive x (1 - loss). The share is bisected in simulation
    until the simulated burst rounds' per-datagram time (:func:`_burst_times`, passes and round trips
    included) matches the run's. Why: on the emulator's shared cores a datagram the burst drops costs
    less (on the 1 Gbit/s star a broadcast datagram took 20-40 us in burst rounds against 43 us),
    and a send cost alone predicts every burst round slow. A host that does not bind, or a run without
    burst rounds, shows no such split: the costs stay 0 and the calibration says so."""
    from dblp.sim.model import simulate

    meas_w, meas_s = _burst_times(recs, burst_rounds)
    trial = cfg.with_(rounds=min(cfg.rounds, 60), fidelity="round")
    rounds = {k for k in burst_rounds if k < trial.rounds}
    sides = {}  # side -> (measured burst time, lossless cost T, SimConfig key of the send rate, of the receive cost)
    for who, meas, t_all, rate_key, recv_key in (
            ("worker", meas_w, 1.0 / cfg.send_pps, "send_pps", "server_recv_cost_s"),
            ("server", meas_s, 1.0 / cfg.server_pps, "server_send_pps", "recv_cost_s")):
        h = host.get(who, {})
        why = (None if h.get("binding") and meas is not None and rounds else
               "the host does not bind" if not h.get("binding") else "no burst rounds")
        if why is None:
            sides[who] = (meas, t_all, rate_key, recv_key)
        h["receive_s"] = 0.0
        h["receive"] = f"not shown: {why}" if why else None

    def split(shares: dict[str, float]) -> SimConfig:
        upd: dict[str, float] = {}
        for who, (_, t_all, rate_key, recv_key) in sides.items():
            upd[rate_key] = 1.0 / ((1.0 - shares[who]) * t_all)
            upd[recv_key] = shares[who] * t_all
        return trial.with_(**upd)

    if not sides:
        return cfg
    lo = {w: 0.0 for w in sides}
    hi = {w: RECV_MAX_SHARE for w in sides}
    sim_w, sim_s = _burst_times(simulate(split(lo)).records, rounds)
    at0 = {"worker": sim_w, "server": sim_s}
    for who in list(sides):  # the burst rounds are no faster than a send cost alone makes them: no receive part
        if at0[who] is None or at0[who] <= sides[who][0]:
            host[who]["receive"] = (f"not shown: burst rounds {sides[who][0] * 1e6:.2f} us a datagram, a send "
                                    f"cost alone {(at0[who] or 0) * 1e6:.2f} us")
            del sides[who]
    if not sides:
        return cfg
    for _ in range(RECV_STEPS):
        mid = {w: 0.5 * (lo[w] + hi[w]) for w in sides}
        sim_w, sim_s = _burst_times(simulate(split(mid)).records, rounds)
        got = {"worker": sim_w, "server": sim_s}
        for who in sides:
            if got[who] is not None and got[who] > sides[who][0]:
                lo[who] = mid[who]  # still slower than the run: more of the cost is the receive part
            else:
                hi[who] = mid[who]
    share = {w: 0.5 * (lo[w] + hi[w]) for w in sides}
    out = split(share)
    upd = {}
    for who, (meas, t_all, rate_key, recv_key) in sides.items():
        upd[rate_key], upd[recv_key] = getattr(out, rate_key), getattr(out, recv_key)
        host[who]["receive_s"] = upd[recv_key]
        host[who]["receive"] = (f"fitted: {share[who]:.0%} of the {t_all * 1e6:.2f} us a datagram is the receive "
                                f"part ({upd[recv_key] * 1e6:.2f} us), from burst rounds at {meas * 1e6:.2f} us "
                                f"a datagram (a send cost alone: {at0[who] * 1e6:.2f} us)")
    return cfg.with_(**upd)


def _simulated_times(cfg: SimConfig, clean: set[int], down_clean: set[int]) -> tuple[float | None, float | None]:
    """The per-datagram times of :func:`_datagram_times` in a simulation of the run's network."""
    from dblp.sim.model import simulate

    trial = cfg.with_(rounds=min(cfg.rounds, 60), fidelity="round")
    recs = simulate(trial).records
    return _datagram_times(recs, {k for k in clean if k < trial.rounds}, {k for k in down_clean if k < trial.rounds})


def _machine(conf: dict) -> dict[str, Any]:
    """What the host constants were measured on: the run's machine facts (config.json's ``_run``: host
    name, cores, load, date, code commit) and this calibration's own."""
    from dblp.cli.provenance import provenance

    run = conf.get("_run") if isinstance(conf.get("_run"), dict) else {}
    now = provenance()
    keep = ("host", "cpus", "load", "time", "git_commit", "git_dirty", "kernel")
    return {"run": {k: run.get(k) for k in keep} if run else None,
            "calibration": {k: now.get(k) for k in keep}}


def _topology(conf: dict) -> dict[str, Any]:
    """The network the run was made on (``topology``, ``racks``, ``spines``, the uplink rate), so the
    refinement simulates that network and not a star: behind an oversubscribed uplink a worker's
    per-datagram time holds the uplink's drops, which a star would lay on the host."""
    topo = _find(conf, "topology")
    if topo == "twosites":  # scenarios/crosscheck.py's names: rates in bit/s (Mbit/s in topologies/twosites.py)
        out2: dict[str, Any] = {"topology": "twosites", "wan_delay_s": _time_s(_find(conf, "wan_delay_s")) or 0.0}
        lw = _find(conf, "local_workers", "local-workers")  # config.json names a flag as typed
        if lw is not None:
            out2["local_workers"] = int(lw)
        wan = _find(conf, "wan_bandwidth_bps", "wan_bandwidth")
        if wan is None and _find(conf, "wan_bw") is not None:
            wan = float(_find(conf, "wan_bw")) * 1e6
        if wan is None:  # the crosscheck's default: the host links' rate
            bw = _find(conf, "bandwidth_bps", "bandwidth")
            wan = float(bw) if isinstance(bw, (int, float)) else None
        if wan is not None:
            out2["wan_bandwidth_bps"] = float(wan)
        return out2
    if topo != "leafspine":  # the star is the default
        return {}
    out: dict[str, Any] = {"topology": "leafspine"}
    for key in ("racks", "spines"):
        v = _find(conf, key)
        if v is not None:
            out[key] = int(v)
    up = _find(conf, "uplink_bandwidth_bps", "uplink_bandwidth")  # bit/s, as the scenarios store rates
    if up is None and _find(conf, "uplink_bw") is not None:  # topologies/leafspine.py's Mbit/s
        up = float(_find(conf, "uplink_bw")) * 1e6
    if up is not None:
        out["uplink_bandwidth_bps"] = float(up)
    return out


def _datagram_times(recs: list[RoundRecord], clean: set[int], down_clean: set[int]
                    ) -> tuple[float | None, float | None]:
    """Median per-datagram send time upstream (per worker) and of the broadcast (server host).

    Upstream only a worker's single-pass records count: a round is lossless for the calibration
    when some worker sent in one pass, but behind a congested leaf-spine uplink the others of that
    round may have needed a second pass, whose wait is not the host's send cost."""
    h_w = median([r.up_latency_s / r.up_sent for r in recs
                   if r.role == "worker" and r.round in clean and r.up_sent > 0 and r.up_passes == 1], finite=True, empty=None)
    return h_w, _broadcast_datagram_time(recs, down_clean)


def _refine(cfg: SimConfig, h_w: float | None, h_s: float | None, clean: set[int], down_clean: set[int],
            est: dict) -> SimConfig:
    """Match the measured per-datagram times in simulation, scaling the binding hosts' send rates
    (``h_w``/``h_s`` None: that host does not bind; its rate stays).

    The first estimate takes each time as the host's own; but a broadcast's
    time also holds the worker links' queues and the round-robin between
    senders, so simulate, measure the same statistic in the simulated
    records, and rescale - a few times, each step at most a factor of 2 (a
    host's own first estimate, not a link's rate, is the scale)."""
    from dblp.sim.model import simulate

    trial = cfg.with_(rounds=min(cfg.rounds, 60), fidelity="round")
    steps = []
    for _ in range(4):
        recs = simulate(trial).records
        sw, ss = _datagram_times(recs, {k for k in clean if k < trial.rounds},
                                 {k for k in down_clean if k < trial.rounds})
        upd: dict[str, float] = {}
        err = 0.0
        if h_w and sw:
            upd["send_pps"] = trial.send_pps * min(2.0, max(0.5, sw / h_w))
            err = max(err, abs(sw / h_w - 1))
        if h_s and ss:
            upd["server_send_pps"] = trial.server_pps * min(2.0, max(0.5, ss / h_s))
            err = max(err, abs(ss / h_s - 1))
        steps.append({"worker_datagram_s": sw, "server_datagram_s": ss})
        if not upd or err < 0.01:
            break
        trial = trial.with_(**upd)
    est["refinement"] = steps
    return cfg.with_(send_pps=trial.send_pps, server_send_pps=trial.server_send_pps)


def _burst_rounds(events: list[dict]) -> set[int]:
    out: set[int] = set()
    for s in _burst_specs(events):
        if s["kind"] == "iteration_bursts":
            for a in s["at"]:
                out.update(range(a, a + s.get("length", 1)))
    return out


def _burst_specs(events: list[dict]) -> list[dict]:
    """Iteration and timed bursts of an emulation burst log as loss specs."""
    applied: dict[Any, dict] = {}
    specs: list[dict] = []
    t0 = next((e.get("t") for e in events if e.get("event") == "start"), None)
    for e in events:
        ev = e.get("event")
        if ev == "apply" and e.get("kind") in ("iteration", "timed"):
            applied[e.get("burst")] = e
        elif ev == "remove" and e.get("burst") in applied:
            a = applied.pop(e.get("burst"))
            loss = float(a.get("loss", 0.0))
            if a.get("kind") == "iteration" and a.get("iteration") is not None:
                start = int(a["iteration"])
                end = int(e["iteration"]) if e.get("iteration") is not None else start + 1
                specs.append({"kind": "iteration_bursts", "at": [start], "loss": loss, "length": max(1, end - start)})
            elif a.get("kind") == "timed" and t0 is not None:
                specs.append({"kind": "time_bursts", "at_s": [float(a["t"]) - t0], "loss": loss,
                              "duration_s": max(1e-6, float(e["t"]) - float(a["t"]))})
    return specs


def cmd_calibrate(args: argparse.Namespace) -> int:
    base = SimConfig.from_json(args.base) if args.base else None
    cfg, notes = calibrate(args.results, base=base, refine=not args.no_refine)
    out = Path(args.output)
    cfg.to_json(out, extra={"_calibration": {"source": str(args.results), **notes}})
    e = notes.get("estimates", {})
    print(f"{args.results}: {notes['records']} records ({notes['skipped_lines']} lines skipped), "
          f"{e.get('lossless_rounds', 0)} lossless rounds -> {out}")
    print(f"  link {cfg.bandwidth_bps / 1e6:.1f} Mbit/s, worker {cfg.send_pps:.0f} datagrams/s, "
          f"server {cfg.server_pps:.0f} datagrams/s (send part), receive {cfg.server_recv_cost_s * 1e6:.2f} / "
          f"{cfg.recv_cost_s * 1e6:.2f} us a delivered datagram (server / worker), compute {cfg.compute_s * 1e3:.2f} ms, "
          f"reduce {cfg.reduce_s * 1e3:.2f} ms, policy {cfg.policy}, {len(cfg.loss)} loss process(es)")
    for who, h in ((k, e.get("host", {}).get(k)) for k in ("worker", "server")):
        if h:
            print(f"  {who} host: {h['how']}")
            if h.get("receive"):
                print(f"  {who} host's datagrams, receive part: {h['receive']}")
    print(f"  run it: python -m dblp.sim run --params {out}")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("calibrate", help="simulator parameters from an emulation results folder",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("results", help="emulation run folder (records/*.jsonl or *.jsonl, config.json, bursts.jsonl)")
    p.add_argument("-o", "--output", default="params.json", help="params file to write")
    p.add_argument("--base", default=None, help="params.json for everything the run does not tell")
    p.add_argument("--no-refine", action="store_true",
                   help="skip matching the send rates in simulation (first estimates only)")
    p.set_defaults(func=cmd_calibrate)
    return p
