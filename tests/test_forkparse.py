"""dblp.transport.forkparse: large inputs parsed in forked children, answers read by the caller's selector.

The server's login loop relies on three things: the answer of a parse comes back whole (megabytes,
more than a pipe holds), a parse that raises is answered with its message, and ending the loop
with parses still running or waiting kills them at once and leaves no child behind - the thing
multiprocessing.Pool.terminate() could not promise (it hung a server under test for > 60 s)."""

from __future__ import annotations

import os
import selectors
import time

import pytest

from dblp.transport.forkparse import ForkParsers, ParseFailed


def _slow_echo(body: bytes) -> bytes:
    if body.startswith(b"raise"):
        raise ValueError("a bad input: " + body[:9].decode())
    if body.startswith(b"die"):
        os._exit(3)
    if body.startswith(b"sleep"):
        time.sleep(float(body[5:9]))
    return body[::-1]


def _drain(sel: selectors.BaseSelector, fp: ForkParsers, want: int, timeout: float = 20.0) -> list:
    got: list = []
    end = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < end:
        for key, _ in sel.select(0.5):
            assert fp.owns(key.fileobj)
            answered = fp.on_ready(key.fileobj)
            if answered is not None:
                got.append(answered)
    return got


def _children() -> set[int]:
    me = os.getpid()
    kids = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                kids.add(int(pid))
    return kids


def test_answers_of_megabytes_come_back_whole_in_submit_order():
    sel = selectors.DefaultSelector()
    fp = ForkParsers(sel, _slow_echo)
    bodies = [bytes([i]) * (3 << 20) + b"end" for i in range(4)]  # 3 MiB each: ~50 pipe buffers
    for i, b in enumerate(bodies):
        fp.submit(i, b)
    assert fp.busy() == 4
    got = _drain(sel, fp, 4)
    assert [k for k, _ in got] == [0, 1, 2, 3]  # one at a time (at_once=1): in order
    assert all(v == bodies[k][::-1] for k, v in got)
    assert fp.busy() == 0 and not sel.get_map()
    fp.close()


def test_a_parse_that_raises_or_dies_is_answered_with_why():
    sel = selectors.DefaultSelector()
    fp = ForkParsers(sel, _slow_echo, at_once=2)
    fp.submit("bad", b"raise it!")
    fp.submit("dead", b"die")
    got = dict(_drain(sel, fp, 2))
    assert isinstance(got["bad"], ParseFailed) and str(got["bad"]) == "a bad input: raise it!"
    assert isinstance(got["dead"], ParseFailed) and "ended without an answer" in str(got["dead"])
    fp.close()


def test_close_kills_running_and_waiting_parses_at_once_and_leaves_no_child():
    before = _children()
    for trial in range(5):  # closing at different moments of a parse and of an answer being written
        sel = selectors.DefaultSelector()
        fp = ForkParsers(sel, _slow_echo)
        fp.submit("slow", b"sleep9.00")
        for i in range(7):
            fp.submit(i, bytes([i]) * (3 << 20))
        time.sleep(0.05 * trial)
        t = time.monotonic()
        fp.close()
        assert time.monotonic() - t < 1.0
        assert fp.busy() == 0 and not sel.get_map()
    assert not _children() - before  # killed and reaped: no zombie left (another test's child may end meanwhile)


def test_a_cancelled_input_is_not_parsed_and_frees_its_place():
    """A login let go while its HELLO waits (or is parsed) must not keep megabytes queued: cancel
    takes it off the queue, or kills its child; the others are answered as before."""
    sel = selectors.DefaultSelector()
    fp = ForkParsers(sel, _slow_echo)
    fp.submit("slow", b"sleep9.00")
    for i in range(3):
        fp.submit(i, bytes([i]) * (1 << 20))
    fp.cancel(1)  # waiting: dropped
    assert fp.busy() == 3
    t = time.monotonic()
    fp.cancel("slow")  # running: killed, the next one starts
    assert time.monotonic() - t < 1.0 and fp.busy() == 2
    got = _drain(sel, fp, 2)
    assert [k for k, _ in got] == [0, 2] and got[1][1] == bytes([2]) * (1 << 20)
    fp.close()


def test_refusals():
    with pytest.raises(ValueError, match="at_once must be at least 1, got 0"):
        ForkParsers(selectors.DefaultSelector(), _slow_echo, at_once=0)
