"""Topologies come up on Linux bridges, hosts can reach the server, and everything goes away."""

from __future__ import annotations

import json

import pytest

from emu_helpers import udp_transfer


def test_link_opts_carry_shaping():
    """No root needed: the Topo puts bw/buffer on its links, delay only when asked."""
    from topologies.star import StarTopo

    t = StarTopo(n=3, bw=50, buffer_pkts=20, cross_hosts=1, cross_bw=500)
    assert sorted(t.hosts()) == ["srv", "w1", "w2", "w3", "x1"]
    infos = {frozenset((a, b)): t.linkInfo(a, b) for a, b in t.links()}
    assert infos[frozenset(("srv", "s1"))]["bw"] == 50.0
    assert infos[frozenset(("srv", "s1"))]["buffer_pkts"] == 20
    assert infos[frozenset(("x1", "s1"))]["bw"] == 500.0
    assert "delay" not in infos[frozenset(("w1", "s1"))]


def test_topos_dicts_for_mn_custom():
    from topologies import leafspine, star, twosites

    assert set(star.topos) == {"star"}
    assert set(leafspine.topos) == {"leafspine"}
    assert set(twosites.topos) == {"twosites"}


def test_leafspine_and_twosites_layout():
    from topologies.leafspine import LeafSpineTopo
    from topologies.twosites import TwoSitesTopo

    ls = LeafSpineTopo(racks=3, n=4, uplink_bw=200)
    assert sorted(ls.switches()) == ["leaf1", "leaf2", "leaf3", "spine1"]
    assert len(ls.links()) == 3 + 5  # leaf-spine uplinks + host links
    ts = TwoSitesTopo(n=3, local_workers=1, wan_bw=10, wan_buffer_pkts=5)
    wan = ts.linkInfo("s1", "s2")
    assert wan["bw"] == 10.0 and wan["buffer_pkts"] == 5
    assert ts.linkInfo("w3", "s2")["bw"] == 1000.0


@pytest.mark.mininet
def test_star_up_down(ready_file):
    """Star with 3 workers: shaped both ends, each worker reaches srv, clean teardown."""
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    with EmuNet(StarTopo(n=3, bw=100, buffer_pkts=50)) as net:
        assert net.hosts == ["srv", "w1", "w2", "w3"]
        stats = net.qdisc_stats()
        # every link end carries a TBF: 4 host ends + 4 switch ports
        assert len(stats) == 8
        assert all(s["qdiscs"][0]["kind"] == "tbf" for s in stats.values())
        opts = json.loads(net.cmd("w2", ["tc", "-j", "qdisc", "show", "dev", "w2-eth0"]))[0]
        assert opts["options"]["rate"] == 100e6 / 8  # bytes/s
        # tc reports the byte limit as latency: (limit - burst) / rate
        limit = 50 * 1514
        lat_us = (limit - opts["options"]["burst"]) / (100e6 / 8) * 1e6
        assert abs(opts["options"]["lat"] - lat_us) < 50
        for i, w in enumerate(["w1", "w2", "w3"]):
            res = udp_transfer(net, w, "srv", 9100 + i, ready_file, count=50, rate_mbps=5)
            assert res["received"] == 50


@pytest.mark.mininet
def test_star_with_jumbo_frames():
    """``mtu=9000``: every link end and bridge carries it, and a full 9000-byte packet crosses a
    20 Mbit/s TBF link whole (its default bucket, 4 x 1514 bytes, would drop it)."""
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    with pytest.raises(ValueError, match="mtu"):
        EmuNet(StarTopo(n=1), mtu=70000)
    with EmuNet(StarTopo(n=1, bw=20, buffer_pkts=50), mtu=9000) as net:
        for h in ("srv", "w1"):
            link = json.loads(net.cmd(h, ["ip", "-j", "link", "show", "dev", net.host_intf(h)]))[0]
            assert link["mtu"] == 9000
            port = json.loads(net.switch_cmd(h, ["ip", "-j", "link", "show", "dev", net.switch_port(h)]))[0]
            assert port["mtu"] == 9000
        opts = json.loads(net.cmd("w1", ["tc", "-j", "qdisc", "show", "dev", "w1-eth0"]))[0]["options"]
        assert abs(opts["burst"] - 4 * 9014) <= 8  # (tc rounds it to its clock ticks)
        # 8972 bytes of ICMP payload + 28 of headers = a 9000-byte packet, DF set: no fragmenting
        out = net.cmd("w1", ["ping", "-M", "do", "-s", "8972", "-c", "3", "-i", "0.2", "-W", "2", net.ip("srv")],
                      check=False, timeout=20)
        assert " 0% packet loss" in out, out


@pytest.mark.mininet
def test_twosites_and_leafspine_connectivity(ready_file):
    from emulation.net import EmuNet
    from topologies.leafspine import LeafSpineTopo
    from topologies.twosites import TwoSitesTopo

    with EmuNet(TwoSitesTopo(n=2, local_workers=1, wan_bw=20)) as net:
        res = udp_transfer(net, "w2", "srv", 9200, ready_file, count=50, rate_mbps=5)
        assert res["received"] == 50
    with EmuNet(LeafSpineTopo(racks=2, n=2)) as net:
        res = udp_transfer(net, "w1", "srv", 9201, ready_file, count=50, rate_mbps=5)
        assert res["received"] == 50


def test_star_takes_mininets_names_and_refuses_what_it_cannot_honour():
    from topologies.star import StarTopo

    t = StarTopo(n=1, max_queue_size=50)
    assert all(t.linkInfo(a, b).get("buffer_pkts") == 50 for a, b in t.links())
    with pytest.raises(ValueError, match="loss=0.1: link loss needs netem"):
        StarTopo(n=1, loss=0.1)


@pytest.mark.mininet
def test_mn_custom_pingall_without_pythonpath(tmp_path):
    """The Mininet habit, as written in the topology's docstring: no PYTHONPATH, from anywhere."""
    import shutil
    import subprocess
    from pathlib import Path

    mn = shutil.which("mn")
    if mn is None:
        pytest.skip("Mininet's mn is not installed")
    star = Path(__file__).resolve().parents[2] / "topologies" / "star.py"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    out = subprocess.run([mn, "--custom", str(star), "--topo", "star,n=3", "--switch", "ipbr", "--controller",
                          "none", "--test", "pingall"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Results: 0% dropped (12/12 received)" in out.stdout + out.stderr


def test_leafspine_and_twosites_take_mininets_names():
    from topologies.leafspine import LeafSpineTopo
    from topologies.twosites import TwoSitesTopo

    ls = LeafSpineTopo(racks=2, n=2, bw=20, delay="1ms", max_queue_size=30)
    assert all(ls.linkInfo(a, b)["buffer_pkts"] == 30 and ls.linkInfo(a, b)["delay"] == "1ms"
               for a, b in ls.links())
    ts = TwoSitesTopo(n=2, bw=40, max_queue_size=9, delay="2ms")
    assert all(ts.linkInfo(a, b)["bw"] == 40.0 and ts.linkInfo(a, b)["buffer_pkts"] == 9
               for a, b in ts.links())
    assert TwoSitesTopo(n=2, bw=40, wan_bw=5).linkInfo("s1", "s2")["bw"] == 5.0  # wan_* wins
    for cls in (LeafSpineTopo, TwoSitesTopo):
        with pytest.raises(ValueError, match="loss=1: link loss needs netem"):
            cls(loss=1)


def test_link_options_in_both_vocabularies():
    """``emulation.mnlink`` reads Mininet's names and refuses what TBF cannot honour."""
    from emulation.mnlink import link_shape, shape_opts
    from emulation.shaping import FRAME_BYTES

    params = {"bw": 10, "max_queue_size": 20, "addr1": "x"}
    shape = link_shape(params)
    assert shape.bw_mbps == 10 and shape.buffer_bytes == 20 * FRAME_BYTES and params == {"addr1": "x"}
    for bad, match in (({"loss": 2}, "loss=2"), ({"jitter": "1ms"}, "jitter=1ms"),
                       ({"use_hfsc": True}, "use_hfsc=True"),
                       ({"max_queue_size": 5, "buffer_pkts": 5}, "same queue")):
        with pytest.raises(ValueError, match=match):
            shape_opts(dict(bad))


def test_command_line_link_options_win_over_the_topologys():
    """``mn --link tc,bw=50,max_queue_size=50`` on a topology that sets bw and buffer_pkts: the
    command line's rate and queue, one queue (not "both given")."""
    from emulation.mnlink import link_shape, merge_link_params
    from emulation.shaping import FRAME_BYTES

    topo = {"bw": 100.0, "buffer_pkts": 100}
    merged = merge_link_params(topo, {"bw": 50, "max_queue_size": 50})
    assert merged == {"bw": 50, "max_queue_size": 50}
    shape = link_shape(dict(merged))
    assert shape.bw_mbps == 50 and shape.buffer_bytes == 50 * FRAME_BYTES
    assert merge_link_params({"bw": 100.0, "buffer_bytes": 9000}, {"bw": 20}) == {"bw": 20, "buffer_bytes": 9000}
    assert merge_link_params(topo, {}) == topo


def _mn(tmp_path, *args: str):
    import shutil
    import subprocess
    from pathlib import Path

    mn = shutil.which("mn")
    if mn is None:
        pytest.skip("Mininet's mn is not installed")
    star = Path(__file__).resolve().parents[2] / "topologies" / "star.py"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run([mn, "--custom", str(star), *args, "--switch", "ipbr", "--controller", "none"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _srv_tbf_after_pingall(tmp_path, topo: str, link: str) -> dict:
    """Run ``mn --topo TOPO --link LINK --test pingall``; srv's root qdisc (tc's JSON) as it was built."""
    (tmp_path / "pre").write_text("srv tc -j qdisc show dev srv-eth0\n")
    out = _mn(tmp_path, "--topo", topo, "--link", link, "--pre", str(tmp_path / "pre"), "--test", "pingall")
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "0% dropped" in text, text[-2000:]
    return json.loads(next(line for line in text.splitlines() if line.startswith("[{")))[0]


def _assert_tbf(qd: dict, mbit: float, pkts: int) -> None:
    from emulation.shaping import FRAME_BYTES

    rate = mbit * 1e6 / 8
    assert qd["kind"] == "tbf" and qd["options"]["rate"] == rate
    assert abs(qd["options"]["lat"] - (pkts * FRAME_BYTES - qd["options"]["burst"]) / rate * 1e6) < 50


@pytest.mark.mininet
def test_mn_link_tc_honours_max_queue_size_and_refuses_loss(tmp_path):
    """``--link tc`` is the testbed's TBF: rate and a finite queue of max_queue_size packets; a
    refused option exits before anything is built (mn's error path would run ``mn -c``)."""
    _assert_tbf(_srv_tbf_after_pingall(tmp_path, "star,n=1,bw=50,max_queue_size=20", "tc"), 50, 20)
    out = _mn(tmp_path, "--topo", "star,n=1", "--link", "tc,loss=1", "--test", "none")
    assert out.returncode != 0 and "loss=1: link loss needs netem" in out.stderr
    assert "Cleanup" not in out.stdout + out.stderr


@pytest.mark.mininet
def test_mn_link_tc_takes_max_queue_size_on_the_command_line(tmp_path):
    """Mininet's habit, ``--link tc,bw=50,max_queue_size=50`` on the testbed's star (which sets its
    own bw and queue): accepted, and the link is 50 Mbit/s with a 50-packet queue."""
    _assert_tbf(_srv_tbf_after_pingall(tmp_path, "star,n=1", "tc,bw=50,max_queue_size=50"), 50, 50)
