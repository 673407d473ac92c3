"""Per-datagram loss with UDP GSO senders: segmented links (emulation.loss.segment_links).

A GSO sender hands the kernel 44 datagrams per ``sendmsg``. On a plain veth
link the super-packet crosses every hook whole, so a drop rule drops 44 at a
time; on a segmented link the host's device cuts it, the rules on the switch
end see (and drop) single datagrams, and the receiver's GRO merges the
survivors again. Counted here datagram by datagram at the receiver, with the
nft counters beside. Namespace hosts (no Mininet), a few seconds.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "nft", "ethtool")),
                       reason="needs ip, nft and ethtool"),
]

from emulation.loss import LossController, LossTarget, hook_of, segment_links  # noqa: E402
from emulation.nshosts import NsNet  # noqa: E402

SEG, PER_CALL, CALLS, PORT = 1200, 44, 100, 9999


def within_binomial(lost: int, n: int, p: float, z: float = 5.0) -> bool:
    """Whether ``lost`` of ``n`` datagrams is a plausible count for independent drops at rate
    ``p``: inside z standard deviations of the binomial mean. Why not a fixed band: the jumbo
    case sends 800 datagrams, where [0.25, 0.35] is only 3.1 sigma wide and failed CI once
    (198 of 800 lost, 0.2475); 4400 datagrams at 5 sigma is tighter than that band."""
    return abs(lost - n * p) <= z * math.sqrt(n * p * (1 - p))

# numbered datagrams of argv[2] bytes, argv[3] per sendmsg (UDP_SEGMENT = 103)
SENDER = f"""
import socket, struct, sys, time
seg, per_call = int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
buf = bytearray(seg * per_call)
for c in range({CALLS}):
    for i in range(per_call):
        struct.pack_into("!I", buf, i * seg, c * per_call + i)
    s.sendmsg([bytes(buf)], [(socket.SOL_UDP, 103, struct.pack("H", seg))], 0, (sys.argv[1], {PORT}))
    time.sleep(0.0005)
"""
# UDP_GRO (104) on, as the transport has it: prints the numbers received and the recvmsg calls.
# It waits up to 30 s for the first datagram and only then stops after 1 s without one (as
# emulation.udptool recv does): an idle limit counted from the bind failed the test whenever the
# sender's interpreter took over 1 s to start (reproduced with the test in a cgroup held to 3% of a CPU).
RECEIVER = f"""
import json, os, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.setsockopt(socket.SOL_UDP, 104, 1)
s.bind(("0.0.0.0", {PORT}))
open(sys.argv[1], "w").close()
s.settimeout(30.0)
got, calls = [], 0
while True:
    try:
        data, anc, _, _ = s.recvmsg(65535, 64)
    except socket.timeout:
        break
    calls += 1
    s.settimeout(1.0)
    seg = next((struct.unpack("H", v[:2])[0] for lvl, typ, v in anc if typ == 104), len(data))
    got += [struct.unpack_from("!I", data, o)[0] for o in range(0, len(data), seg)]
print(json.dumps({{"got": got, "calls": calls}}))
"""


def gso_transfer(net, src: str, dst: str, ready: str, seg: int = SEG, per_call: int = PER_CALL) -> dict:
    """CALLS GSO sends of ``per_call`` numbered datagrams of ``seg`` bytes src -> dst; the receiver's
    numbers and calls."""
    rx = net.popen(dst, [sys.executable, "-c", RECEIVER, ready], stdout=subprocess.PIPE, text=True)
    t_end = time.monotonic() + 10
    while not os.path.exists(ready):
        assert time.monotonic() < t_end, "receiver did not bind"
        time.sleep(0.01)
    net.cmd(src, [sys.executable, "-c", SENDER, net.address(dst), str(seg), str(per_call)])
    out, _ = rx.communicate(timeout=30)
    os.unlink(ready)
    return json.loads(out)


def whole_runs_lost(got: list[int], per_call: int = PER_CALL) -> int:
    """Sends of which no datagram arrived."""
    return CALLS - len({g // per_call for g in got})


@pytest.mark.parametrize("direction,lossy", [("ingress", "b"), ("egress", "a")])
def test_segmented_link_drops_single_datagrams(direction, lossy, tmp_path):
    """30% loss on a segmented link: about 30% of the datagrams are lost, spread over every send
    (a whole-super-packet drop would lose ~30 sends whole); the rule saw every datagram, and the
    receiver's GRO still merged the survivors (far fewer calls than datagrams)."""
    total = CALLS * PER_CALL
    with NsNet(["a", "b"]) as net, LossController(net, segmented=True) as lc:
        segment_links(net, ["a", "b"])
        target = LossTarget(lossy, direction)
        assert hook_of(net, target, True).switch_end
        lc.set_loss(target, 0.3)
        res = gso_transfer(net, "a", "b", str(tmp_path / "ready"))
        got = res["got"]
        c = lc.counters()[target.label()]
        print(f"{direction}@{lossy}: received {len(got)}/{total} in {res['calls']} calls; nft {c}")
        assert len(set(got)) == len(got)
        assert within_binomial(total - len(got), total, 0.3)
        assert whole_runs_lost(got) == 0
        assert c["seen_packets"] == total
        assert c["dropped_packets"] == total - len(got)
        assert res["calls"] < len(got) / 2  # GRO merged (without it: one call per datagram)


def test_plain_link_drops_whole_super_packets(tmp_path):
    """Why: without segmentation the sender's egress hook sees one packet per send and drops
    all of its datagrams or none."""
    with NsNet(["a", "b"]) as net, LossController(net) as lc:
        target = LossTarget("a", "egress")
        lc.set_loss(target, 0.3)
        got = gso_transfer(net, "a", "b", str(tmp_path / "ready"))["got"]
        c = lc.counters()[target.label()]
        assert c["seen_packets"] == CALLS
        assert len(got) == (CALLS - c["dropped_packets"]) * PER_CALL
        assert whole_runs_lost(got) == c["dropped_packets"]


def test_segment_links_round_trip():
    """The mode can be set and undone on a live net (the benchmark switches per run)."""
    with NsNet(["a", "b"]) as net:
        segment_links(net, ["a", "b"])
        feats = net.cmd("a", ["ethtool", "-k", "eth0"])
        assert "tx-udp-segmentation: off" in feats and "generic-receive-offload: on" in feats
        port = net.switch_port("a")
        assert "tcp-segmentation-offload: off" in net.switch_cmd("a", ["ethtool", "-k", port])
        assert "pfifo" in net.switch_cmd("a", ["tc", "qdisc", "show", "dev", port])  # backpressure, not drops
        segment_links(net, ["a", "b"], on=False)
        assert "tx-udp-segmentation: on" in net.cmd("a", ["ethtool", "-k", "eth0"])
        assert "noqueue" in net.switch_cmd("a", ["tc", "qdisc", "show", "dev", port])
        with pytest.raises(ValueError, match="switch end"):
            hook_of(net, LossTarget("a", intf="eth0"), True)


@pytest.mark.mininet
@pytest.mark.parametrize("mtu,seg,per_call", [(1500, SEG, PER_CALL), (9000, 8000, 8)], ids=["mtu1500", "jumbo"])
def test_mininet_star_segmented_by_the_controller(tmp_path, mtu, seg, per_call):
    """The emulation's --gso mode (LossController.use_segmented_links on a Mininet star):
    a 30% rule on the server's ingress drops single datagrams of a GSO sender - also of
    8000-byte datagrams on jumbo links (``--mtu 9000``)."""
    from emulation.net import EmuNet
    from topologies.star import StarTopo

    total = CALLS * per_call
    with EmuNet(StarTopo(n=1, bw=None), mtu=mtu) as net, LossController(net) as lc:
        lc.use_segmented_links(net.hosts)
        target = LossTarget("srv", "ingress")
        lc.set_loss(target, 0.3)
        got = gso_transfer(net, "w1", "srv", str(tmp_path / "ready"), seg, per_call)["got"]
        c = lc.counters()[target.label()]
        assert c["switch_end"] == net.switch_port("srv")
        # 8 datagrams a send: all 8 lost by chance in 0.7% of runs (0.3**8 x 100 sends); 44 a send: never
        assert within_binomial(total - len(got), total, 0.3)
        assert whole_runs_lost(got, per_call) <= (per_call < 44)
        assert c["seen_packets"] == total and c["dropped_packets"] == total - len(got)
        with LossController(net, table="other_loss") as lc2:  # rules on host hooks first: refused
            lc2.set_loss(LossTarget("w1"), 0.0)
            with pytest.raises(RuntimeError, match="before the first"):
                lc2.use_segmented_links(net.hosts)


@pytest.mark.mininet
def test_trace_replay_on_segmented_links_drops_exactly_the_traced_datagrams(tmp_path):
    """A packet trace (every 3rd datagram lost, looped) replayed on the switch end of a segmented
    Mininet link: a GSO sender loses exactly the traced datagrams, none merged into a run."""
    import numpy as np

    from emulation.net import EmuNet
    from emulation.replay import TraceReplayer
    from topologies.star import StarTopo
    from traces import PacketTrace

    pk = PacketTrace(np.arange(3) == 2)
    pk = PacketTrace(pk.drops, meta=pk.meta.with_(loop=True))
    total = CALLS * PER_CALL
    with EmuNet(StarTopo(n=1, bw=None)) as net, LossController(net) as lc:
        lc.use_segmented_links(net.hosts)
        with TraceReplayer(lc, pk, [LossTarget("srv", "ingress")]) as rp:
            got = gso_transfer(net, "w1", "srv", str(tmp_path / "ready"))["got"]
            kern = rp.summary()["kernel"]["srv:ingress:udp"]
        assert sorted(got) == [k for k in range(total) if k % 3 != 2]
        assert kern["seen"] == total and kern["dropped"] == total - len(got)
