"""TBF shaping holds the configured rate (iperf3) and netem is probed, never assumed."""

from __future__ import annotations

import json
import subprocess

import pytest

from emulation.shaping import FRAME_BYTES, Shape, default_burst, shape_commands


def test_shape_from_link_opts():
    s = Shape.from_link_opts({"bw": 100, "buffer_pkts": 20})
    assert s.bw_mbps == 100.0 and s.buffer_bytes == 20 * FRAME_BYTES
    assert Shape.from_link_opts({"bw": 10, "buffer_bytes": 30000}).buffer_bytes == 30000
    assert Shape.from_link_opts({}) is None
    assert default_burst(100) == 12500  # 1 ms at 100 Mbit/s
    assert default_burst(1) == 4 * FRAME_BYTES
    cmd = shape_commands("x-eth0", s)[0]
    assert cmd[cmd.index("limit") + 1] == str(20 * FRAME_BYTES)


def test_a_shape_on_jumbo_links_holds_four_frames_in_its_bucket():
    """A TBF bucket smaller than a frame drops every frame: at MTU 9000 a slow link's bucket grows."""
    slow = Shape.from_link_opts({"bw": 20, "buffer_pkts": 2})
    assert slow.fit_mtu(1500) is slow and slow.burst_bytes == 4 * FRAME_BYTES  # 1 ms at 20 Mbit/s is less
    jumbo = slow.fit_mtu(9000)
    assert jumbo.burst_bytes == 4 * 9014 and jumbo.buffer_bytes == 4 * 9014  # the queue holds the bucket too
    fast = Shape.from_link_opts({"bw": 1000, "buffer_pkts": 100})
    assert fast.fit_mtu(9000) is fast  # 1 ms at 1 Gbit/s (125 kB) holds four jumbo frames already
    assert Shape(bw_mbps=None).fit_mtu(9000) == Shape(bw_mbps=None)


def test_delay_needs_netem():
    from emulation.netem import NetemUnavailable, has_netem

    s = Shape.from_link_opts({"bw": 100, "delay": "5ms"})
    if has_netem():
        cmds = shape_commands("x-eth0", s)
        assert "netem" in cmds[0] and "tbf" in cmds[1]
    else:
        with pytest.raises(NetemUnavailable):
            shape_commands("x-eth0", s)


@pytest.mark.mininet
def test_netem_probe_leaves_nothing():
    from emulation.netem import has_netem

    has_netem.cache_clear()
    result = has_netem()
    assert isinstance(result, bool)
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "dblpem-netem" not in out


@pytest.mark.mininet
@pytest.mark.parametrize("bw", [100.0])
def test_tbf_rate_iperf3(bw):
    """iperf3 TCP over a shaped worker->server path lands within 15% of the configured rate."""
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    with EmuNet(StarTopo(n=1, bw=bw, buffer_pkts=100)) as net:
        from emulation.sysutil import wait_listening

        server = net.popen("srv", ["iperf3", "-s", "-1", "-p", "5301"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(server, 5301)  # (a 0.3 s sleep here: refused whenever iperf3 started later)
        out = net.cmd("w1", ["iperf3", "-c", net.ip("srv"), "-p", "5301", "-t", "3", "-J"],
                      timeout=20)
        server.wait(timeout=5)
        res = json.loads(out)
        mbps = res["end"]["sum_received"]["bits_per_second"] / 1e6
        print(f"configured {bw} Mbit/s, iperf3 TCP measured {mbps:.1f} Mbit/s")
        assert abs(mbps - bw) / bw < 0.15, mbps
        # and the shaper really was the limit: the veth alone does ~16 Gbit/s here
        assert mbps < bw * 1.05
