"""Pacing on real namespace hosts and TBF links (emulation.pacecheck): a hand-paced sender's
delivered rate, and self-pacing's passes without any rate flag against an unpaced flood."""

from __future__ import annotations

import os
import shutil

import pytest

from emulation import pacecheck

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or any(shutil.which(t) is None for t in ("ip", "tc", "nft")),
    reason="namespace hosts need root, iproute2 (ip, tc) and nft")


@needs_netns
def test_paced_sender_delivers_its_rate(tmp_path):
    """Paced at 180 Mbit/s on a 200 Mbit/s link (plain path, 20 MB uploads): most of the rate
    leaves, and not more than the rate (the bucket starts full: +1% at most on a 0.9 s upload).

    The target is >= 90% (the row's `threshold`, printed met or not by the benchmark);
    measured 0.96-1.00 at load 1-7, but 0.36 with the test held to 15% of a CPU (docs/flaky.md),
    so the test's own floor is 0.75: still far above the pacer bug it pins (0.44-0.5 of the rate
    delivered, docs/pacing.md), and not a coin toss on a starved machine."""
    row = pacecheck.rate_check(200e6, False, model="5M", iterations=3, out=tmp_path)
    assert 0.75 <= row.measured <= 1.05, row.detail
    assert row.threshold == 0.9 and row.met == (row.measured >= 0.9) and "paced at 180 Mbit/s" in row.detail


@needs_netns
def test_no_rate_flag_needs_few_passes_where_unpaced_floods(tmp_path):
    """100 Mbit/s links, 100-packet queues, 3 workers, 200k floats, 10 rounds: unpaced senders
    (--pace 0) need many passes per round (18.6 at 500k); with no rate flag the
    senders pace themselves, and only the first round's unpaced pass floods. From round 2 on the
    uploads share the server's grant (R12) and the broadcast's streams the server's one rate a
    round (R14): from round 2 the broadcast needed 1.00-1.12 passes a round in nine runs
    (load 1-3; without R14 it needs 1.4-1.9 from round 1)."""
    run = pacecheck._run(3, 100e6, 100, model="200k", iterations=10, pace_bps=None, out=tmp_path / "auto")
    auto = pacecheck._passes(run)
    up2, down2 = pacecheck._passes(run, since=2)[2:]
    flood = pacecheck._passes(pacecheck._run(3, 100e6, 100, model="200k", iterations=4, pace_bps=0.0,
                                             out=tmp_path / "unpaced"))
    up, down, up1, down1 = auto
    assert max(flood[0], flood[1]) >= 3.0, flood
    # (bounds from 5 runs, 23:48-00:05 UTC: up 1.13-1.67, down 1.38-1.88; the rehearsal on a fresh
    # clone gave up 1.67 once - a bound at the spread's edge is a flaky test, not a stricter one)
    assert max(up, down, up1, down1) <= 2.5, auto
    assert max(up, down) < max(flood[0], flood[1]), (auto, flood)
    # R14, from round 2 (8 rounds): 1.00-1.12 measured; 1.4 allows three lossy probes of two passes (the
    # start's 1.25x step and the probe after it cost two, docs/pacing.md)
    assert down2 <= 1.4, (down2, up2)
