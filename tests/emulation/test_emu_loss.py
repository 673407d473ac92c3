"""nftables random drop, without netem: measured loss, port filtering, quick rule swaps."""

from __future__ import annotations

import time

import pytest

from emu_helpers import udp_transfer
from emulation.loss import LossTarget
from emulation.nft import threshold as rate_to_threshold


def test_target_validation():
    assert LossTarget("srv").match() == "meta l4proto udp"
    assert LossTarget("srv", dports=(5000, 5099)).match() == "udp dport 5000-5099"
    assert LossTarget("srv", proto="all").match() == "meta protocol { ip, ip6 }"
    with pytest.raises(ValueError):
        LossTarget("srv", direction="sideways")
    with pytest.raises(ValueError):
        LossTarget("srv", proto="all", dports=(1, 2))
    assert rate_to_threshold(0.7) == 7000
    with pytest.raises(ValueError):
        rate_to_threshold(1.5)


@pytest.mark.mininet
@pytest.mark.parametrize("direction,host", [("ingress", "srv"), ("egress", "w1")])
def test_udp_drop_70_percent(direction, host, ready_file):
    """A 70% rule gives a measured loss in [0.6, 0.8] over 2000 datagrams; counters agree."""
    from emulation.loss import LossController
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    with EmuNet(StarTopo(n=1, bw=100)) as net, LossController(net) as lc:
        target = LossTarget(host, direction)
        lc.set_loss(target, 0.7)
        res = udp_transfer(net, "w1", "srv", 9000, ready_file, count=2000, rate_mbps=20)
        loss = 1 - res["received"] / res["sent"]
        c = lc.counters()[target.label()]
        print(f"{direction}@{host}: measured UDP loss {loss:.3f}, nft dropped "
              f"{c['dropped_packets']}/{c['seen_packets']}")
        assert 0.6 <= loss <= 0.8
        assert res["send_errors"] == 0  # a drop on the wire is silent to the sender
        assert c["seen_packets"] == 2000
        assert c["dropped_packets"] == 2000 - res["received"]


@pytest.mark.mininet
def test_port_range_and_rate_change(ready_file):
    """Only the chosen UDP ports lose packets; swapping the rate is a fast atomic replace."""
    from emulation.loss import LossController
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    with EmuNet(StarTopo(n=1, bw=100)) as net, LossController(net) as lc:
        target = LossTarget("srv", "ingress", dports=(9000, 9009))
        lc.set_loss(target, 1.0)
        other = udp_transfer(net, "w1", "srv", 9010, ready_file, count=300, rate_mbps=20)
        assert other["received"] == 300
        hit = udp_transfer(net, "w1", "srv", 9005, ready_file, count=300, rate_mbps=20,
                          deadline=2)
        assert hit["received"] == 0
        t0 = time.perf_counter()
        for r in (0.5, 0.0, 0.7, 0.0):
            lc.set_loss(target, r)
        per_change = (time.perf_counter() - t0) / 4
        print(f"rule change takes {per_change * 1000:.1f} ms")
        assert per_change < 0.1
        clean = udp_transfer(net, "w1", "srv", 9005, ready_file, count=300, rate_mbps=20)
        assert clean["received"] == 300
        c = lc.counters()[target.label()]
        assert c["seen_packets"] == 600 and c["dropped_packets"] == 300
        assert [e["rate"] for e in lc.log] == [1.0, 0.5, 0.0, 0.7, 0.0]
