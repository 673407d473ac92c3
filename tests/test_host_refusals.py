"""The host side's small refusals: each bad input refused by name, no traceback.

Secret files another user owns or that are dangling links, a config file that
is not UTF-8, records paths that cannot be written, an odd-length hex secret;
what ``server --help`` says about the UDP data ports (and that it is so); the
shared-memory slot of a worker killed in its handshake (cleanup removes it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dblp.protocol import auth
from dblp.cli.commands import build_parser
from dblp.cli.commands import main as dblp_main
from dblp.cli.args import parser, server_secret

REPO = Path(__file__).resolve().parents[1]
HEX = "ab" * 32


def _secret_file(path: Path, text: str = HEX) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_secret_file_owned_by_another_user_is_refused(tmp_path):
    f = _secret_file(tmp_path / "secret")
    assert auth.read_secret_file(f) == bytes.fromhex(HEX)  # our own: fine
    os.chown(f, 65534, 65534)  # nobody's, still 0600
    with pytest.raises(auth.AuthError, match=r"owned by .*uid 65534.*not by .*uid 0"):
        auth.read_secret_file(f)


def test_a_dangling_secret_file_link_is_neither_followed_nor_created(tmp_path):
    target = tmp_path / "elsewhere" / "planted"
    target.parent.mkdir()
    link = tmp_path / "secret"
    link.symlink_to(target)
    args = SimpleNamespace(insecure=False, secret_file=str(link))
    with pytest.raises(auth.AuthError, match="a symbolic link to .*planted.*which does not exist"):
        server_secret(args, env={})
    with pytest.raises(auth.AuthError, match="a symbolic link to .*planted"):
        auth.write_secret_file(link, HEX)
    assert not target.exists() and link.is_symlink()
    # a new secret still goes to a path that does not exist yet, 0600
    new = tmp_path / "new"
    secret, where = server_secret(SimpleNamespace(insecure=False, secret_file=str(new)), env={})
    assert len(secret) == 32 and oct(new.stat().st_mode & 0o777) == "0o600" and str(new) in where


def test_an_odd_length_hex_secret_is_called_odd_length():
    with pytest.raises(auth.AuthError, match=r"odd number of hex digits \(63\)"):
        auth.parse_secret("a" * 63, "$DBLP_SECRET")
    with pytest.raises(auth.AuthError, match="must be hex digits.* 2 of 64 characters"):
        auth.parse_secret("zz" + "a" * 62, "$DBLP_SECRET")
    assert auth.parse_secret(HEX, "x") == bytes.fromhex(HEX)


def test_a_config_file_that_is_not_utf8_is_refused_by_name(tmp_path, capsys):
    bad = tmp_path / "run.toml"
    bad.write_bytes(b"port = 5\n\xff\xfe = 1\n")
    ap = parser("x")
    ap.add_argument("--port", default="1", help="p")
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["--config", str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --config: '{bad}' is not UTF-8 text (byte 0xff at offset 9)" in err and "Traceback" not in err


def test_records_paths_that_cannot_be_written_name_the_flag(tmp_path, capsys):
    assert dblp_main(["server", "--records", "/proc/version", "--insecure", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "dblp server: error: --records /proc/version: cannot append records there" in err, err
    assert "cannot listen" not in err
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "r.jsonl"
    assert dblp_main(["worker", "--server", "127.0.0.1:9", "--records", str(bad), "--insecure"]) == 2
    err = capsys.readouterr().err
    assert f"dblp worker: error: --records {bad}: cannot append records there: File exists ({tmp_path / 'file'} " \
           "is in the way)" in err, err


def test_server_help_says_udp_data_uses_ports_of_its_own():
    from dblp.protocol.policy import FixedPolicy
    from dblp.transport.server import ParameterServer, ServerConfig
    from dblp.transport.worker import Worker

    server = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "server")[1]
    text = " ".join(server.format_help().split())
    assert "UDP data does not use it" in text and "net.ipv4.ip_local_port_range" in text
    # and so it is: each worker's data to and from a UDP port of its own, not the control port
    elements, secret = 358 * 3, b"k" * 32
    srv = ParameterServer(ServerConfig(host="127.0.0.1", port=0, workers=2, elements=elements, rounds=1,
                                       policy=FixedPolicy(0.0), peer_timeout=20, secret=secret))
    seen: dict = {}

    def serve() -> None:
        srv.accept_workers()
        seen["ports"] = [w.peer.udp.port for w in srv.workers]
        srv.serve()

    def work(i: int) -> None:
        with Worker("127.0.0.1", srv.port, elements=elements, worker_id=i, secret=secret) as w:
            seen[i] = (w.meta.get("server_udp_port"), np.array(w.allreduce(np.full(elements, i, np.float32))))

    threads = [threading.Thread(target=serve)] + [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ports = seen["ports"]
    assert len(set(ports)) == 2 and srv.port not in ports
    assert sorted([seen[0][0], seen[1][0]]) == sorted(ports)
    assert np.all(seen[0][1] == 0.5) and np.all(seen[1][1] == 0.5)


@pytest.mark.skipif(os.geteuid() != 0, reason="the cleanup command needs root")
def test_the_slot_of_a_worker_killed_in_its_handshake_is_removed_by_cleanup(tmp_path):
    """Its slot is unlinked once the server attached; killed before that (kill -9), the file stays
    until ``python -m emulation.cleanup`` (its name names the dead worker)."""
    from dblp.transport.hostlocal import LOCAL_DIR, PREFIX
    from emulation.cleanup import cleanup

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers the HELLO
        code = ("from dblp.transport.worker import Worker; "
                f"Worker('127.0.0.1', {silent.getsockname()[1]}, elements=358 * 4, secret=b'k' * 32, "
                "local=True, peer_timeout=60).connect()")
        w = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
        try:
            deadline = time.monotonic() + 30
            while not (slots := list(LOCAL_DIR.glob(f"{PREFIX}{w.pid}-*"))) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(slots) == 1, "the worker made no slot"
            w.kill()
            w.wait(10)
        finally:
            if w.poll() is None:
                w.kill()
                w.wait()
    assert slots[0].exists()  # killed in the handshake: left
    done = cleanup(verbose=False, registry=Path(tempfile.mkdtemp(dir=tmp_path)), sweeps=frozenset({"slots"}))
    assert str(slots[0]) in done["slots"] and not slots[0].exists()


def test_a_datagram_of_another_run_counts_unauthenticated_as_the_readme_says():
    """The README: on the authenticated wire another run's datagram (same secret, its own run id and so
    its own key) is counted ``unauthenticated``; ``foreign`` counts a valid tag naming another sender."""
    from dblp.protocol import control as ctl
    from dblp.protocol import wire
    from dblp.protocol.core import Receiver

    secret, elements = b"s" * 32, 358 * 4
    ours, theirs = wire.ChunkLayout(elements, key=auth.data_key(secret, 1)), \
        wire.ChunkLayout(elements, key=auth.data_key(secret, 2))
    vals = np.arange(elements, dtype=np.float32)
    seqs = np.arange(ours.chunks, dtype=np.int64)
    out = np.zeros(elements, np.float32)
    r = Receiver(ours, run_id=1, expected_sender=wire.SERVER_ID, direction=ctl.DOWN)
    r.begin_round(0, out, 0.0, tolerance=0.0)
    other_run, lens = wire.encode_chunks(vals, theirs, seqs, run_id=2, sender=wire.SERVER_ID, round_no=0)
    r.receive_batch(other_run, lens, 0.0)
    other_sender, lens = wire.encode_chunks(vals, ours, seqs, run_id=1, sender=7, round_no=0)
    r.receive_batch(other_sender, lens, 0.0)
    d = r.stats.drops
    assert (d.unauthenticated, d.foreign, r.received) == (ours.chunks, ours.chunks, 0)
