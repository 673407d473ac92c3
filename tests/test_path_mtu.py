"""``--mtu auto``: the server sizes datagrams for the link its address sits on (dblp.transport.udp.auto_mtu),
and a worker whose route carries less says so."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from procs import ROOT, env, free_port, reports, start_server, start_verify_workers
from dblp.transport import worker as worker_mod
from dblp.cli.commands import build_parser
from dblp.runs.loopback import loopback_rounds
from dblp.transport.server import ParameterServer, ServerConfig
from dblp.transport.udp import AUTO_MTU_CAP, auto_mtu, is_loopback, link_mtu, route_mtu
from dblp.protocol.wire import MAX_MTU, ParameterError
from dblp.transport.worker import Worker

LO = int(Path("/sys/class/net/lo/mtu").read_text())
LO_AUTO = min(LO, AUTO_MTU_CAP, MAX_MTU)


def _other_address() -> tuple[str, int] | None:
    """An IPv4 address of this host on a link other than lo, and that link's MTU."""
    for _, name in socket.if_nameindex():
        if name == "lo":
            continue
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", name], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            addr = line.split()[3].split("/")[0]
            return addr, int(Path("/sys/class/net", name, "mtu").read_text())
    return None


def test_loopback_addresses_get_lo_mtu_capped():
    assert link_mtu("127.0.0.1") == LO and link_mtu("localhost") == LO
    assert is_loopback("localhost") and is_loopback("127.0.0.9") and not is_loopback("0.0.0.0")
    assert auto_mtu("127.0.0.1")[0] == LO_AUTO == auto_mtu("127.0.0.9")[0]
    assert auto_mtu("127.0.0.1")[0] <= 65535


def test_wildcard_and_foreign_addresses_get_1500():
    for host in ("0.0.0.0", "::", ""):
        mtu, why = auto_mtu(host)
        assert mtu == 1500 and "wildcard" in why
    mtu, why = auto_mtu("203.0.113.77")  # TEST-NET-3: no interface here holds it
    assert mtu == 1500 and "no interface holds 203.0.113.77" in why


def test_own_address_on_another_link_gets_that_links_mtu():
    """The route to one's own address goes through lo (65,535 from IP_MTU), whatever link holds it:
    auto must read the link, as a server bound to a 1500-byte veth's address would."""
    got = _other_address()
    if got is None:
        pytest.skip("no IPv4 address outside lo")
    addr, mtu = got
    assert route_mtu(addr) == 65535  # what a connected socket says: lo's route
    assert auto_mtu(addr)[0] == min(mtu, AUTO_MTU_CAP)


def test_server_config_resolves_auto():
    cfg = ServerConfig(host="127.0.0.1", port=0, mtu="auto")
    assert cfg.mtu == LO_AUTO and "127.0.0.1" in cfg.mtu_source
    assert ServerConfig(host="0.0.0.0", port=0, mtu="auto").mtu == 1500
    with pytest.raises(ParameterError, match="mtu"):
        ServerConfig(port=0, mtu="banana")


@pytest.mark.parametrize("cmd", ["server", "loopback"])
def test_mtu_flag_takes_auto_and_refuses_by_name(cmd, capsys):
    ap = build_parser()
    assert ap.parse_args([cmd, "--mtu", "auto"]).mtu == "auto"
    assert ap.parse_args([cmd, "--mtu", "9000"]).mtu == 9000
    assert ap.parse_args([cmd]).mtu == ("auto" if cmd == "loopback" else 1500)
    for bad, says in (("banana", "'banana' is not an integer or auto"), ("70000", "576-65535 bytes"),
                      ("10", "576-65535 bytes"), ("100", "'100': a link's MTU is 576-65535 bytes")):
        with pytest.raises(SystemExit):
            ap.parse_args([cmd, "--mtu", bad])
        err = capsys.readouterr().err
        assert "argument --mtu" in err and says in err


def test_loopback_run_at_auto_uses_lo_mtu():
    res = loopback_rounds(300_000, workers=2, rounds=2, warmup=0, timeout=120)
    assert res.mtu == LO_AUTO and res.to_dict()["mtu"] == LO_AUTO and len(res.round_s) == 2
    with pytest.raises(ParameterError, match="mtu"):
        loopback_rounds(1000, mtu="banana")


def test_server_at_auto_delivers_the_exact_mean():
    """Three worker processes, a server at --mtu auto on 127.0.0.1: lo-sized datagrams, bit-exact means."""
    port, rounds = free_port(), 3
    srv = start_server(port, "--workers", "3", "--policy", "reliable", "--iterations", str(rounds), "--mtu", "auto")
    try:
        reps = reports(start_verify_workers(port, 3, 1_000_000, rounds), timeout=120)
        srv.wait(timeout=30)
    finally:
        srv.kill()
    assert srv.returncode == 0, srv.stderr.read()
    assert f"MTU {LO_AUTO} (the {LO}-byte link holding 127.0.0.1" in srv.stdout.read()
    for r in reps:
        assert r["mtu"] == LO_AUTO and r["exact_rounds"] == rounds and r["bad_chunks"] == 0


def test_worker_warns_once_when_its_route_carries_less(monkeypatch, caplog):
    """A server at MTU 9000 and a worker whose route (faked: 1500) carries less: one warning naming
    the fix, and the rounds still work (the kernel fragments)."""
    monkeypatch.setattr(worker_mod, "route_mtu", lambda host: 1500)
    monkeypatch.setattr(worker_mod, "_MTU_WARNED", set())
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=1, mtu=9000, rounds=1, peer_timeout=10))
    th = threading.Thread(target=srv.serve, daemon=True)
    th.start()
    g = np.arange(20_000, dtype=np.float32)
    with caplog.at_level(logging.WARNING, logger="dblp.transport.worker"):
        with Worker("127.0.0.1", srv.port, elements=g.size) as w:
            assert np.array_equal(w.allreduce(g), g)
        again = worker_mod.check_path_mtu("127.0.0.1", srv.port, 9000)
    th.join(10)
    said = [r.getMessage() for r in caplog.records if "fragmented" in r.getMessage()]
    assert len(said) == 1 and said[0] == again
    assert "9000-byte MTU" in said[0] and "carries 1500 bytes" in said[0] and "--mtu 1500" in said[0]


def test_worker_command_prints_the_warning_on_stderr():
    """As a command's logging shows it: one stderr line however often it is checked, no traceback
    (the route faked to 1400 bytes in a fresh interpreter)."""
    code = ("import logging, sys; logging.basicConfig(level=logging.WARNING);"
            "from dblp.transport import worker as w; w.route_mtu = lambda h: 1400;"
            "w.check_path_mtu('127.0.0.1', 29600, 9000); w.check_path_mtu('127.0.0.1', 29600, 9000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr
    lines = [x for x in out.stderr.splitlines() if "fragmented" in x]
    assert len(lines) == 1 and "start the server with --mtu 1400" in lines[0]
