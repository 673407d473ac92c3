"""The sans-I/O login (dblp.protocol.login) driven directly: hand-made bytes in, exact actions out.

No sockets and no clock: connections are named by strings, time is a number given to each call,
and the server's nonces are fixed, so every CHALLENGE, BYE and proof below is known byte for byte.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct

from dblp.protocol import auth
from dblp.protocol import control as ctl
from dblp.protocol.login import (NORM_MESSAGE_BYTES, Drop, HubGate, Parse, Refuse, Send, ShardVerified, WorkerGate,
                                 WorkerVerified, assign_ids, encode_norm)

SECRET = bytes(range(32))
NONCE_W = bytes.fromhex("00112233445566778899aabbccddeeff")  # the worker's
NONCE_S = b"S" * 16  # the server's, every CHALLENGE's
ADDR = ("10.0.0.2", 40000)
ELEMENTS = 1000


def frame(t: int, body: bytes) -> bytes:
    return struct.pack("!IB", len(body) + 1, t) + body


def hello(worker: int = 0, nonce: bytes = NONCE_W, version: int = ctl.PROTOCOL_VERSION,
          elements: int = ELEMENTS) -> bytes:
    """A HELLO frame as a worker writes it (its JSON keys in its own order)."""
    d = {"version": version, "worker": worker, "udp_port": 9000,
         "spec": {"elements": elements, "names": [], "shapes": []}}
    if nonce:
        d["nonce"] = nonce.hex()
    return frame(1, json.dumps(d).encode())


def canon(worker: int = 0, nonce: bytes = NONCE_W) -> bytes:
    return ctl.encode(ctl.Hello(worker, 9000, {"elements": ELEMENTS, "names": [], "shapes": []}, nonce=nonce.hex()))


def auth_frame(proof: bytes) -> bytes:
    return frame(11, proof)


def bye(why: str, key: bytes | None = None) -> bytes:
    return ctl.encode(ctl.Bye(f"refused: {why}"), ctl.ControlMac(key) if key else None)


def gate(workers: int = 2, secret: bytes | None = SECRET, now: float = 100.0, **kw) -> WorkerGate:
    kw.setdefault("max_pending", 64)
    return WorkerGate(workers, secret, timeout=10.0, accept_timeout=120.0, now=now, new_nonce=lambda: NONCE_S, **kw)


def test_a_good_login_challenge_auth_verified_admitted():
    g = gate()
    assert g.connect("a", ADDR, 100.0) == []
    out = g.receive("a", hello(0))
    bound = NONCE_W + b"|" + NONCE_S + b"|" + hashlib.sha256(canon()).digest()
    server_proof = hmac.new(SECRET, b"dblp server|" + bound, hashlib.sha256).digest()
    assert out == [Send("a", frame(10, NONCE_S + server_proof))]  # CHALLENGE: nonce, then proof
    worker_proof = auth.proof(SECRET, "worker", NONCE_W, NONCE_S, canon())
    out = g.receive("a", auth_frame(worker_proof))
    keys = auth.control_keys(SECRET, NONCE_W, NONCE_S, canon())
    assert out == [WorkerVerified("a", ctl.decode_frame(1, hello(0)[5:]), keys)]
    assert (g.pending, g.admitted, g.spec) == (0, 0, None)  # verified, not yet admitted
    g.admit("a")
    assert (g.admitted, g.done, g.taken) == (1, False, {0})
    assert g.spec == {"elements": ELEMENTS, "names": [], "shapes": []}  # the first admitted fixes the tensor


def test_a_hello_and_its_auth_in_one_read_and_bytes_split_anywhere():
    g = gate(workers=1)
    g.connect("a", ADDR, 0.0)
    data = hello(0) + auth_frame(auth.proof(SECRET, "worker", NONCE_W, NONCE_S, canon()))
    out = []
    for i in range(0, len(data), 7):  # 7 bytes at a time: the frames are put together
        out += g.receive("a", data[i:i + 7])
    assert [type(a).__name__ for a in out] == ["Send", "WorkerVerified"]


def test_a_wrong_proof_is_refused_by_name():
    g = gate()
    g.connect("a", ADDR, 0.0)
    g.receive("a", hello(0))
    out = g.receive("a", auth_frame(auth.proof(bytes(32), "worker", NONCE_W, NONCE_S, canon())))
    why = "authentication failed: the worker does not hold this run's secret"
    assert out == [Refuse("a", ADDR, why, "auth", bye(why))]
    assert g.pending == 0
    # the server's own proof sent back (reflected) fails too: the role is in it
    g.connect("b", ADDR, 0.0)
    challenge = g.receive("b", hello(0))[0]
    assert isinstance(challenge, Send)
    assert g.receive("b", auth_frame(challenge.data[5 + 16:]))[0].why == why


def test_an_oversized_hello_is_refused_on_its_header():
    g = gate()
    g.connect("a", ADDR, 0.0)
    out = g.receive("a", struct.pack("!IB", ctl.MAX_HELLO + 2, 1) + b"{")  # 5 bytes and one of the body
    why = (f"control frame length {ctl.MAX_HELLO + 2} out of range (limit {ctl.MAX_HELLO + 1} bytes): "
           f"a first message may have at most {ctl.MAX_HELLO} bytes")
    assert out == [Refuse("a", ADDR, why, "malformed", bye(why))]


def test_the_timeout_is_the_time_given():
    g = gate()
    g.connect("a", ADDR, 100.0)
    assert g.wake() == 110.0  # its deadline, before the gate's (220)
    assert g.expire(109.999) == []
    assert g.expire(110.0) == [Refuse("a", ADDR, "no HELLO within 10 s", "timeout", bye("no HELLO within 10 s"))]
    g.connect("b", ADDR, 200.0)
    g.receive("b", hello(1))  # past its HELLO: now it owes an AUTH, by the same deadline
    assert g.expire(209.0) == []
    assert [a.why for a in g.expire(210.0)] == ["no AUTH within 10 s"]
    assert g.overdue(219.9) is None
    assert g.overdue(220.0) == "only 0 of 2 workers connected within 120 s"


def test_a_duplicate_worker_id_is_refused_and_so_is_one_taken_meanwhile():
    g = gate(workers=3)
    g.connect("a", ADDR, 0.0)
    g.connect("b", ADDR, 0.0)
    g.receive("a", hello(0))
    g.receive("b", hello(0))  # both claim 0 before either proved itself: both are challenged
    g.receive("a", auth_frame(auth.proof(SECRET, "worker", NONCE_W, NONCE_S, canon())))
    g.admit("a")
    out = g.receive("b", auth_frame(auth.proof(SECRET, "worker", NONCE_W, NONCE_S, canon())))
    why = "worker id 0 is taken by another worker"
    key_out = auth.control_keys(SECRET, NONCE_W, NONCE_S, canon())[1]
    assert out == [Refuse("b", ADDR, why, "hello", bye(why, key_out))]  # after AUTH: a tagged BYE
    dec = ctl.ControlDecoder()
    dec.key(ctl.ControlMac(key_out))
    assert dec.feed(out[0].farewell) == [ctl.Bye(f"refused: {why}")]
    g.connect("c", ADDR, 0.0)
    assert g.receive("c", hello(0)) == [Refuse("c", ADDR, why, "hello", bye(why))]  # at its HELLO
    g.connect("d", ADDR, 0.0)
    assert g.receive("d", hello(3))[0].why == "worker id 3 is out of range: this run has workers 0..2"


def test_a_foreign_version_and_a_wrong_kind_are_refused():
    g = gate()
    g.connect("a", ADDR, 0.0)
    assert g.receive("a", hello(0, version=7)) == [
        Refuse("a", ADDR, "protocol version 7, this server speaks 1", "hello",
               bye("protocol version 7, this server speaks 1"))]
    g.connect("b", ADDR, 0.0)
    assert g.receive("b", ctl.encode(ctl.Bye("hi")))[0].why == "expected HELLO, got Bye"
    g.connect("c", ADDR, 0.0)
    assert g.receive("c", frame(1, b"[1, 2"))[0].kind == "malformed"
    g.connect("d", ADDR, 0.0)
    g.receive("d", hello(0))
    assert g.receive("d", hello(0))[0].why == "expected AUTH, got Hello"


def test_the_wire_must_match_the_servers():
    insecure = gate(secret=None)
    insecure.connect("a", ADDR, 0.0)
    assert insecure.receive("a", hello(0))[0].why == (
        "this server runs --insecure (the paper's unauthenticated wire); start the worker with --insecure too")
    insecure.connect("b", ADDR, 0.0)
    out = insecure.receive("b", hello(1, nonce=b""))
    assert out == [WorkerVerified("b", ctl.decode_frame(1, hello(1, nonce=b"")[5:]), None)]
    secure = gate()
    secure.connect("a", ADDR, 0.0)
    assert secure.receive("a", hello(0, nonce=b""))[0].why == (
        "this server requires authentication: give the worker the run's secret (--secret-file or $DBLP_SECRET), "
        "or run both with --insecure")


def test_tensor_size_and_memory():
    g = gate(elements=ELEMENTS + 1)
    g.connect("a", ADDR, 0.0)
    assert g.receive("a", hello(0))[0].why == "tensor of 1,000 elements; this run's tensor has 1,001"
    g = gate(memory_limit=1 << 30)
    g.connect("a", ADDR, 0.0)
    assert g.receive("a", hello(0, elements=10 ** 9))[0].why == (
        "a tensor of 1,000,000,000 elements needs 14.9 GiB on the server, more than its limit of 1.0 GiB "
        "(give the server the tensor size, or a larger limit)")


def test_the_cap_and_the_byte_budget_let_the_oldest_and_the_largest_go():
    g = gate(max_pending=2, max_buffered=100)
    g.connect("a", ADDR, 0.0)
    g.connect("b", ADDR, 0.0)
    g.receive("a", hello(0))  # a passed its HELLO: b, not a, is the one to let go
    out = g.connect("c", ADDR, 0.0)
    why = "shed: 2 logins were waiting (the limit) and this was the oldest"
    assert out == [Refuse("b", ADDR, why, "shed", bye(why))]
    assert g.receive("c", struct.pack("!IB", 500, 1) + b"x" * 60) == []  # 65 buffered: within 100
    out = g.receive("a", struct.pack("!IB", 500, 11) + b"y" * 45)  # 115 over both
    assert [(r.key, r.why) for r in out] == [
        ("c", "shed: 115 bytes of logins were buffered, more than the limit of 100, and this connection held the "
              "most (65)")]


def test_a_large_hello_is_handed_out_and_its_answer_goes_on():
    g = gate(parse_above=50)
    g.connect("a", ADDR, 0.0)
    h = hello(0)
    assert g.receive("a", h) == [Parse("a", h[5:])]
    assert g.wake() == 220.0  # parsing: its own deadline waits
    assert g.expire(50.0) == []
    out = g.parsed("a", ctl.decode_frame(1, h[5:]), canon())
    assert [type(a).__name__ for a in out] == ["Send"]
    g.connect("b", ADDR, 0.0)
    assert g.receive("b", h + h) == [
        Parse("b", h[5:]),
        Refuse("b", ADDR, "sent another message before its HELLO was answered", "malformed",
               bye("sent another message before its HELLO was answered"), parsing=True)]
    assert g.parsed("b", ctl.decode_frame(1, h[5:]), canon()) == []  # refused meanwhile: nothing to do


def test_closed_failed_late_and_the_ids():
    g = gate()
    g.connect("a", ADDR, 0.0)
    assert g.receive("a", b"")[0].why == "closed during its handshake"
    g.connect("b", ADDR, 0.0)
    assert g.failed("b", "Connection reset by peer")[0].kind == "closed"
    g.connect("c", ADDR, 0.0)
    assert g.close("the server has its workers") == [
        Refuse("c", ADDR, "the server has its workers", "late", bye("the server has its workers"))]
    assert assign_ids([-1, 2, 2, 0], 4) == [1, 2, 3, 0]


def test_a_send_that_fails_and_a_gate_that_has_its_logins():
    g = gate(workers=1, secret=None)
    g.connect("a", ADDR, 0.0)
    g.connect("b", ADDR, 0.0)
    why = "cannot send the challenge: Broken pipe"
    assert g.unsent("a", "Broken pipe") == [Refuse("a", ADDR, why, "hello", bye(why))]
    g.receive("b", hello(0, nonce=b""))
    g.admit("b")
    assert g.done and g.receive("b", hello(0, nonce=b"")) == []  # once done, nothing more is taken
    h = hub()
    h.connect("p", ADDR, 0.0)
    assert h.unsent("p", "Broken pipe") == [Drop("p")] and h.pending == 0  # no nonce, no login: uncounted


def hub(now: float = 0.0, **kw) -> HubGate:
    return HubGate(3, SECRET, timeout=5.0, accept_timeout=60.0, now=now, max_pending=64,
                   new_nonce=lambda: b"N" * 16, **kw)


def intro(shard: int, secret: bytes = SECRET, round_no: int = 0, nonce: bytes = b"N" * 16) -> bytes:
    body = struct.pack("!IHd", round_no, shard, 0.0)
    return body + hmac.new(secret, b"dblp-shard-norm/peer" + nonce + body, hashlib.sha256).digest()[:16]


def test_the_norm_hub_sends_a_nonce_and_takes_one_introduction_per_free_shard():
    h = hub()
    assert h.connect("p", ADDR, 0.0) == [Send("p", b"N" * 16)]
    assert h.wants("p") == NORM_MESSAGE_BYTES == 30
    msg = intro(2)
    assert msg == encode_norm(SECRET, b"N" * 16, 0, 2, 0.0, from_hub=False)
    assert h.receive("p", msg[:29]) == [] and h.wants("p") == 1
    assert h.receive("p", msg[29:]) == [ShardVerified("p", 2, b"N" * 16)]
    h.admit("p")
    h.connect("q", ADDR, 0.0)
    assert h.receive("q", intro(2)) == [
        Refuse("q", ADDR, "introduced itself as shard 2, which is not a free shard of 3", "hello")]
    h.connect("r", ADDR, 0.0)
    assert h.receive("r", intro(1, secret=bytes(32))) == [
        Refuse("r", ADDR, "shard peer 10.0.0.2:40000: a norm message without this run's tag (another run, or a "
                          "forgery)", "auth")]
    h.connect("s", ADDR, 0.0)
    assert h.receive("s", intro(1, round_no=4))[0].why == (
        "shard peer 10.0.0.2:40000: norm of round 4 while this server is at round 0")
    h.connect("t", ADDR, 1.0)
    assert h.expire(6.0) == [Refuse("t", ADDR, "no introduction within 5 s", "timeout")]
    assert h.overdue(60.0) == "shard server(s) [1] did not connect within 60 s"
    assert not h.done
    h.connect("u", ADDR, 7.0)
    assert h.receive("u", intro(1)) == [ShardVerified("u", 1, b"N" * 16)]
    h.admit("u")
    assert h.done and h.overdue(61.0) is None
    again = hub(taken={1})  # a second wait (after the first gave up) knows who is in
    assert again.need == 1 and again.overdue(60.0) == "shard server(s) [2] did not connect within 60 s"
