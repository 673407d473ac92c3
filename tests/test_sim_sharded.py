"""The simulator's several parameter servers and sharded mode (dblp.sim; the real mode is dblp.transport.shard).

The analytic values are written out here from first principles; the
simulator's own code is not asked for them.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

import numpy as np
import pytest

from dblp.protocol import control as ctl
from dblp.sim import SimConfig, Simulation, simulate
from dblp.sim.cli import main as sim_main
from dblp.sim.model import NORM_MESSAGE_BYTES
from dblp.sim.network.net import ctrl_wire_bytes
from dblp.sim.studies.sweep import AXES, run_sweep
from dblp.sim.network.topology import build_network
from dblp.protocol.wire import ChunkLayout, ParameterError

MODEL = 1_000_000  # floats
LINKS = dict(bandwidth_bps=10e9, delay_s=50e-6, ctrl_overhead_s=20e-6)


def _steady_mean(records, attr: str = "round_latency_s", skip: int = 1) -> float:
    return float(np.mean([getattr(r, attr) for r in records if r.role == "worker" and r.round >= skip]))


def _ctrl_s(cfg: SimConfig, frame_bytes: int) -> float:
    """A control frame between two worker hosts: the sender's NIC, a link, the receiver's port, a link,
    the processing."""
    wire = ctrl_wire_bytes(frame_bytes)
    return 2 * wire * 8 / cfg.bandwidth_bps + 2 * cfg.delay_s + cfg.ctrl_overhead_s


def _shard_chunks(cfg: SimConfig) -> list[int]:
    return [ChunkLayout(b - a, cfg.mtu).chunks for a, b in cfg.shard_bounds]


def two_step_round_s(cfg: SimConfig) -> float:
    """A lossless, reliable (p = 0) sharded round on a star of equal links, k = workers hosts.

    Reduce-scatter: every host sends its k-1 remote shards, (k-1) c datagrams
    (c a shard's chunks), one host interval h apart - h = max(1/send_pps,
    wire/line rate), so at line rate the host carries (k-1)/k of the
    tensor, N (k-1)/k bytes plus headers; with each host aiming at another
    port at every turn no port queues, and the last datagram crosses
    p = delay + serialisation + delay. The shard servers then exchange their
    squared norms through shard 0 (two control frames, 2 c_norm) and the
    all-gather moves the same (k-1) c datagrams the other way. A worker's
    own shard is host-local (1 ns a datagram, not counted). The next
    round's uploads start when the last broadcast is in: the ROUND of the
    shard that ended last is one STOP and one ROUND later, which the other
    k-2 uploads hide (k >= 3). In all, 2 N (k-1)/k each way per host:

        T = 2 (k-1) c h + 2 p + 2 c_norm
    """
    k = cfg.workers
    c = max(_shard_chunks(cfg))
    wire = cfg.wire_bytes
    h = max(1 / cfg.send_pps, wire * 8 / cfg.bandwidth_bps)
    p = 2 * cfg.delay_s + wire * 8 / cfg.bandwidth_bps
    return 2 * (k - 1) * c * h + 2 * p + 2 * _ctrl_s(cfg, NORM_MESSAGE_BYTES)


def one_server_round_s(cfg: SimConfig) -> float:
    """The paper's single server on the same links, p = 0, no incast (host-bound workers): a worker
    sends C chunks, the server broadcasts C to each of the n workers from one host; STOP and ROUND
    between rounds (tests/sim/sim_helpers.analytic_round_s, the same arithmetic)."""
    n, C = cfg.workers, cfg.layout.chunks
    wire = cfg.wire_bytes
    h = max(1 / cfg.send_pps, wire * 8 / cfg.bandwidth_bps)
    p = 2 * cfg.delay_s + wire * 8 / cfg.bandwidth_bps
    c_stop = _ctrl_s(cfg, len(ctl.encode(ctl.Stop(1, ctl.DOWN, C))))
    c_round = _ctrl_s(cfg, len(ctl.encode(ctl.RoundStart(1, ctl.UP, 0.0, False))))
    return C * h + n * C * h + 2 * p + c_stop + c_round


# -- the sharded round's time -----------------------------------------------------------------------
@pytest.mark.parametrize("workers", [3, 4, 8])
@pytest.mark.parametrize("send_pps", [200_000.0, 1e9], ids=["host-bound", "line-rate"])
def test_lossless_sharded_round_is_the_two_step_time(workers, send_pps):
    """At line rate every port is loaded exactly to capacity; the formula holds while a shard fits
    one turn of the host's round-robin (c <= host_slice, here 346-921 chunks). With several turns
    per shard the turns of hosts that started a control frame apart overlap at a port that cannot
    drain, and its 100-frame buffer overflows (both levels; 4M floats, 4 workers: +15% round level,
    +28% packet level) - a property of the critically loaded all-to-all, not of the formula."""
    cfg = SimConfig(model=MODEL, workers=workers, rounds=5, policy="reliable", aggregation="sharded",
                    send_pps=send_pps, **LINKS)
    res = simulate(cfg)
    want = two_step_round_s(cfg)
    # within 0.05% (measured: 0.005-0.009%): what the formula leaves out is the host-local shard
    # (c ns) and the hub's one-frame head start, microseconds against milliseconds
    assert _steady_mean(res.records) == pytest.approx(want, rel=5e-4)
    assert max(r.up_passes for r in res.records if r.role == "worker") == 1  # no port overflowed
    # each host carried (k-1) shards each way: 2 (k-1) c datagrams of its shard servers and its worker
    c = max(_shard_chunks(cfg))
    sent_down = defaultdict(int)
    for r in res.records:
        if r.role == "server" and r.round == 2 and r.worker != r.extra["shard"]:
            sent_down[r.extra["shard"]] += r.down_sent
    assert sorted(sent_down) == list(range(workers)) and set(sent_down.values()) <= {(workers - 1) * c,
                                                                                      (workers - 1) * (c - 1)}


def test_sharded_round_and_packet_levels_agree():
    """The round level's fluid ports against the packet level's exact FIFOs on the same sharded
    run (host-bound: every port has room; round 0 is left out - at the packet level the ROUNDs of
    round 0 reach a host one frame apart and its first quantum can meet another's at one port)."""
    base = dict(model=MODEL, workers=4, rounds=4, policy="reliable", aggregation="sharded", send_pps=600e3, **LINKS)
    rnd = simulate(SimConfig(**base))
    pkt = simulate(SimConfig(**base, fidelity="packet"))
    assert _steady_mean(pkt.records) == pytest.approx(_steady_mean(rnd.records), rel=1e-3)
    assert _steady_mean(rnd.records) == pytest.approx(two_step_round_s(SimConfig(**base)), rel=2e-3)


@pytest.mark.parametrize("workers", [3, 4, 8])
def test_sharded_is_faster_than_one_server_from_three_workers(workers):
    """Host-bound workers (no incast at the server): the single server's host sends n C, a sharded
    host 2 C (n-1)/n - the two analytic values, and the simulator's ratio between them."""
    base = dict(model=MODEL, workers=workers, rounds=4, policy="reliable", **LINKS)
    one = SimConfig(**base)
    sh = SimConfig(**base, aggregation="sharded")
    t_one, t_sh = _steady_mean(simulate(one).records), _steady_mean(simulate(sh).records)
    assert t_one == pytest.approx(one_server_round_s(one), rel=2e-3)
    assert t_sh < t_one
    assert t_sh / t_one == pytest.approx(two_step_round_s(sh) / one_server_round_s(one), rel=3e-3)
    assert t_one / t_sh > {3: 2.9, 4: 3.2, 8: 5.0}[workers]  # (n+1) / (2 (n-1)/n): 3.0, 3.33, 5.14


# -- several dedicated parameter servers ------------------------------------------------------------
def test_k_servers_carry_one_kth_of_one_servers_load_each():
    """servers=3: each server host's link carries the up- and downstream of its third of the tensor,
    1/3 of what the single server's carries (to its shard's rounding up to whole chunks)."""
    base = dict(model=MODEL, workers=4, rounds=3, policy="reliable", **LINKS)
    one = simulate(SimConfig(**base))
    three = simulate(SimConfig(**base, servers=3))

    def link_load(records, shard=None) -> int:
        return sum(r.up_received + r.down_sent for r in records
                   if r.role == "server" and (shard is None or r.extra["shard"] == shard))

    total = link_load(one.records)
    C = SimConfig(**base).layout.chunks
    assert total == 2 * C * 4 * 3  # both directions, 4 workers, 3 rounds
    chunks = _shard_chunks(SimConfig(**base, servers=3))
    for j in range(3):
        assert link_load(three.records, j) == 2 * chunks[j] * 4 * 3
        assert link_load(three.records, j) / total == pytest.approx(1 / 3, abs=1 / C)
    # the broadcast is what the single server's host serialised: the round is ~ half the time
    # (4 workers: C + 4C against C + 4C/3)
    assert _steady_mean(three.records) / _steady_mean(one.records) == pytest.approx((1 + 4 / 3) / 5, rel=0.01)


def test_several_servers_have_ports_of_their_own_and_share_the_servers_rack():
    cfg = SimConfig(model=MODEL, workers=3, rounds=1, servers=2, topology="leafspine", racks=2)
    net = build_network(cfg)
    assert [h.name for h in net.server_hosts] == ["server0", "server1"]
    # flow j * workers + i: worker i -> server j; worker w1 (index 0) is in rack 2, w2 in rack 1 with the servers
    assert [path.ports[-1].name for path in net.up_paths] == ["->server0"] * 3 + ["->server1"] * 3
    assert [p.name for p in net.up_paths[1].ports] == ["->server0"]  # same rack: one switch
    assert [p.name for p in net.up_paths[0].ports][0] == "leaf2->spines"
    assert net.hub_paths[0] is None and net.hub_paths[1][0].ports[-1].name == "->server0"
    star = build_network(SimConfig(model=MODEL, workers=3, rounds=1, aggregation="sharded"))
    assert star.server_hosts == star.worker_hosts  # a shard server on each worker's host
    assert [p.port.name for p in star.up_paths[:3]] == ["w0-lo-up", "->w0", "->w0"]
    assert star.local == [True, False, False, False, True, False, False, False, True]
    # two sites, sharded: a flow crosses the WAN when its two hosts are in different sites
    two = build_network(SimConfig(model=MODEL, workers=3, rounds=1, aggregation="sharded", topology="twosites",
                                  local_workers=1))
    assert two.remote == [False, True, True, True, False, False, True, False, False]
    assert [p.name for p in two.up_paths[1].ports] == ["s2->wan", "->w0"]
    # leaf-spine racks: sharded hosts are only the workers (w1 in rack 2, w2 in rack 1, ...)
    from dblp.sim.network.topology import hosts_per_rack

    assert hosts_per_rack(SimConfig(model=MODEL, workers=4, rounds=1, topology="leafspine", racks=2,
                                    aggregation="sharded")) == 2
    assert hosts_per_rack(SimConfig(model=MODEL, workers=4, rounds=1, topology="leafspine", racks=2,
                                    servers=3)) == 5  # 3 servers + w2, w4 in rack 1


# -- records and tolerances -------------------------------------------------------------------------
def test_under_loss_a_workers_record_merges_its_shards():
    cfg = SimConfig(model=MODEL, workers=4, rounds=6, policy="fixed", p=0.01, aggregation="sharded",
                    loss=[{"kind": "bernoulli", "p": 0.05}], **LINKS)
    sim = Simulation(cfg)
    res = sim.run()
    per = defaultdict(list)
    for r in sim.shard_records:
        per[(r.worker, r.round)].append(r)
    merged = {(r.worker, r.round): r for r in res.records if r.role == "worker"}
    assert sorted(per) == sorted(merged) and len(merged) == 4 * 6
    assert all(len(v) == 4 for v in per.values())
    spread = 0
    for key, m in merged.items():
        shards = per[key]
        assert m.up_passes == max(s.up_passes for s in shards)
        assert m.down_passes == max(s.down_passes for s in shards)
        for f in ("chunks", "up_sent", "up_received", "down_received"):
            assert getattr(m, f) == sum(getattr(s, f) for s in shards), f
        assert m.round_latency_s == pytest.approx(max(s.t_start + s.round_latency_s for s in shards)
                                                  - min(s.t_start for s in shards))
        assert m.extra["aggregation"] == "sharded" and m.extra["shards"] == 4
        spread += max(s.up_passes for s in shards) > min(s.up_passes for s in shards)
        own = shards[key[0]]  # shard records come in shard order; a worker's own shard is host-local
        assert own.down_received == own.chunks and own.up_received == own.chunks
    assert spread > 0  # shards of one round did need different passes: the max is not trivial
    for r in res.records:  # the shard servers took their own host's worker's shard whole, the others not always
        if r.role == "server" and r.worker == r.extra["shard"]:
            assert r.up_received == r.chunks
    assert min(r.up_received / r.chunks for r in res.records if r.role == "server") < 1
    # the summary's broadcast passes: per worker and round the most any shard needed, as the merge
    most = defaultdict(int)
    for r in res.records:
        if r.role == "server":
            most[(r.worker, r.round)] = max(most[(r.worker, r.round)], r.down_passes)
    assert res.summary()["down_passes"] == pytest.approx(np.mean(list(most.values())))
    assert res.summary()["down_passes"] > np.mean([r.down_passes for r in res.records if r.role == "server"])
    assert sum(m.chunks for m in merged.values()) == 4 * 6 * sum(_shard_chunks(cfg))


def test_every_shard_announces_the_same_tolerance_each_round():
    cfg = SimConfig(model=MODEL, workers=4, rounds=24, policy="dblp", freq=2, eta=0.3, norms="varied",
                    aggregation="sharded", loss=[{"kind": "bernoulli", "p": 0.02}], **LINKS)
    res = simulate(cfg)
    by_round = defaultdict(list)
    for r in res.records:
        if r.role == "server":
            by_round[r.round].append(r)
    assert sorted(by_round) == list(range(24)) and all(len(v) == 4 * 4 for v in by_round.values())
    for rnd, recs in by_round.items():
        assert len({r.tolerance_down for r in recs}) == 1, rnd
        assert len({r.tolerance_up for r in recs}) == 1, rnd
        assert len({r.grad_norm for r in recs}) == 1, rnd  # the whole mean's norm, from the exchange
        assert len({r.clr for r in recs}) == 1, rnd
    assert len({v[0].tolerance_down for v in by_round.values()}) > 1  # the policy did move
    for r in res.records:
        if r.role == "worker":
            assert r.tolerance_down == by_round[r.round][0].tolerance_down


@pytest.mark.parametrize("mode", [dict(aggregation="sharded"), dict(servers=3)])
def test_shards_norms_add_up_to_the_single_servers(mode):
    """Lossless and reliable, every chunk arrives: the shards' squared norms sum to the one
    server's mean's squared norm, round by round."""
    base = dict(model=MODEL, workers=4, rounds=5, policy="reliable", **LINKS)
    one = [r.grad_norm for r in simulate(SimConfig(**base)).records if r.role == "server" and r.worker == 0]
    many = [r.grad_norm for r in simulate(SimConfig(**base, **mode)).records
            if r.role == "server" and r.worker == 0 and r.extra["shard"] == 0]
    assert many == pytest.approx(one, rel=1e-12)


def test_the_shards_wait_for_each_other_before_broadcasting():
    """The norm exchange is a barrier: each square reaches shard 0 (the hub) one control frame after
    its upstream is in, the sum comes back one frame later; the hub broadcasts when it has them all,
    the others when the sum reaches them (servers=3 on their own equal links: the upstreams end
    together)."""
    cfg = SimConfig(model=MODEL, workers=3, rounds=3, policy="reliable", servers=3, **LINKS)
    res = simulate(cfg)
    c_norm = _ctrl_s(cfg, NORM_MESSAGE_BYTES)
    for rnd in range(3):
        recs = [r for r in res.records if r.role == "server" and r.round == rnd]
        t_up = max(r.t_start + r.extra["wait_others_s"] for r in recs)
        for r in recs:
            start = r.t_start + r.round_latency_s - r.down_latency_s  # the broadcast sender's start
            want = t_up + (c_norm if r.extra["shard"] == 0 else 2 * c_norm)
            assert start == pytest.approx(want, abs=1e-7), (rnd, r.extra["shard"], r.worker)


# -- parameters -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,names", [
    (dict(servers=0), ["servers"]),
    (dict(servers=-1), ["servers"]),
    (dict(servers=2.5), ["servers"]),
    (dict(servers=2, aggregation="sharded"), ["servers", "sharded"]),
    (dict(aggregation="ring"), ["aggregation", "ring"]),
    (dict(aggregation="sharded", workers=1), ["sharded", "workers"]),
    (dict(model=3, servers=4), ["3 elements", "4", "servers"]),
    (dict(model=3, workers=5, aggregation="sharded"), ["3 elements", "5", "workers"]),
    (dict(servers=3, workers=4, switch_ports=5), ["switch_ports", "3 servers"]),
])
def test_bad_parameters_are_refused_by_name(kw, names):
    with pytest.raises(ParameterError) as err:
        SimConfig(**{"model": MODEL, "workers": 3, **kw})
    for n in names:
        assert n in str(err.value)


def test_cli_runs_the_sharded_mode_and_names_bad_flags(capsys):
    assert sim_main(["run", "--aggregation", "sharded", "--workers", "4", "--model", "100000",
                     "--iterations", "3"]) == 0
    assert "round mean" in capsys.readouterr().out
    assert sim_main(["run", "--aggregation", "sharded", "--servers", "2", "--iterations", "1"]) == 2
    err = capsys.readouterr().err
    assert "--servers=2" in err and "--aggregation" in err and "Traceback" not in err


def test_sweep_takes_aggregation_as_an_axis():
    flag, parse, default, field = AXES["aggregation"]
    assert flag == "--aggregation" and default == ["server"] and field == "aggregation"
    assert parse("server,sharded") == ["server", "sharded"]
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown aggregation 'ring' \(known: server, sharded\)"):
        parse("server,ring")
    base = SimConfig(model=100_000, workers=3, rounds=4)
    axes = {"p_high": [0.2], "p_low": [0.008], "eta": [0.5], "freq": [10], "burst_rate": [0.0], "burst_loss": [0.7],
            "burst_len": [1], "aggregation": ["server", "sharded"]}
    rows, _ = run_sweep(base, axes, jobs=1, progress=False)
    assert [r["aggregation"] for r in rows] == ["server", "sharded"]
    assert rows[1]["dblp_mean_round_s"] < rows[0]["dblp_mean_round_s"]
    assert math.isfinite(rows[1]["speedup_mean"])
