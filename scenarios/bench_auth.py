#!/usr/bin/env python3
"""What authentication costs: the authenticated wire against the paper's CRC-only wire, side by side.

Two measurements, each alternating the two wires in one run so that a busy
machine slows both alike:

1. **integrity work per tensor** (one process, no sockets): encoding the
   headers of a ``--model``-sized tensor (CRC-32C, or the AES-GMAC tag) and
   checking whole datagrams (CRC compare, or tag check) - the per-datagram
   work the tag adds, in ns per datagram;
2. **lossless rounds on loopback** (``python -m dblp loopback``: a server
   and ``--workers`` worker processes): the median round time of each wire,
   ``--repeats`` times, and their ratio (target: authenticated within 1.10x);
   the authenticated wire's control messages carry their tag too;
3. **the control-message MAC** (one process, no sockets): encoding and
   decoding each kind of control message a round carries (ROUND, PROBE,
   STOP, a BITMAP of the tensor's chunks, BYE) with and without its tag
   (:class:`dblp.protocol.control.ControlMac`), in microseconds, side by side;
4. **the aggregation guard** (one process): the server's reduce of
   ``--workers`` gradients with and without the guard's per-worker norms
   (:func:`dblp.protocol.reduce.guarded_mean_norm`), alternating, in milliseconds.

The C helper computes tags with Intel's ipsec-mb where it was built with it
(``libipsec-mb-dev``), else with OpenSSL's GCM; part 1 prices every
implementation present, ``--gmac-all`` also times the rounds with each
(``$DBLP_GMAC=openssl`` selects the fallback in the server and workers).

Prints a table and writes ``bench_auth.csv`` / ``.json`` to ``--out``.

    python scenarios/bench_auth.py                 # 25M, 3 workers, 3 repeats: ~2 minutes
    python scenarios/bench_auth.py --quick         # 1M, a smoke run
    python scenarios/bench_auth.py --gmac-all      # rounds with ipsec-mb and with OpenSSL's GCM, beside CRC
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

import _bootstrap  # noqa: E402,F401  (re-exec into the project's .venv; repo root on sys.path)
import numpy as np  # noqa: E402

from dblp.protocol import auth
from dblp.protocol import wire
from dblp.protocol import control as ctl
from dblp.cli.args import model_arg, parser  # noqa: E402
from dblp.runs.gradients import MODEL_HELP, model_elements  # noqa: E402
from dblp.runs.loopback import loopback_rounds  # noqa: E402
from dblp.cli.provenance import write_config  # noqa: E402
from traces.argtypes import count_arg  # noqa: E402


def integrity_cost(elements: int, repeats: int) -> dict[str, float]:
    """ns per datagram of header encoding and of whole-datagram checks, per wire and per GMAC
    implementation of the C helper (medians)."""
    vals = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    out: dict[str, list[float]] = {}
    impls = auth.gmac_implementations()
    wires: list[tuple[str, bytes | None, str | None]] = [("crc", None, None)]
    wires += [(f"tag_{i}", auth.data_key(b"\1" * 32, 7), i) for i in impls] or [("tag", auth.data_key(b"\1" * 32, 7), None)]
    for _ in range(repeats):
        for name, key, impl in wires:
            if impl is not None:
                from dblp import _fastpath as fast
                prev = fast.use_mac(impl)
            lay = wire.ChunkLayout(elements, key=key)
            seqs = np.arange(lay.chunks, dtype=np.int64)
            t = time.perf_counter()
            wire.encode_headers(vals, lay, seqs, run_id=7, sender=1, round_no=1)
            out.setdefault(f"encode_{name}_ns", []).append((time.perf_counter() - t) / lay.chunks * 1e9)
            rows, lens = wire.encode_chunks(vals, lay, seqs[: min(lay.chunks, 20000)], run_id=7, sender=1,
                                            round_no=1)
            t = time.perf_counter()
            ok = wire.rows_ok(rows, lay, lens)
            out.setdefault(f"check_{name}_ns", []).append((time.perf_counter() - t) / rows.shape[0] * 1e9)
            assert ok.all()
            if impl is not None:
                fast.use_mac(prev)
    return {k: statistics.median(v) for k, v in out.items()}


def control_cost(chunks: int, repeats: int, n: int = 2000) -> list[dict]:
    """Microseconds per control message, encoded and decoded, without and with the tag (medians
    of ``repeats`` runs of ``n`` messages), and the frame sizes."""
    bits = np.packbits(np.ones(chunks, bool)).tobytes()
    msgs = {"ROUND": ctl.RoundStart(7, ctl.DOWN, 0.008, True), "PROBE": ctl.Probe(7, ctl.UP, 1),
            "STOP": ctl.Stop(7, ctl.UP, chunks), f"BITMAP ({chunks:,} chunks)": ctl.Bitmap(7, ctl.UP, chunks, bits),
            "BYE": ctl.Bye("worker done")}
    rows = []
    for name, msg in msgs.items():
        times: dict[str, list[float]] = {"plain": [], "tagged": []}
        for _ in range(repeats):
            for kind in ("plain", "tagged"):
                send = ctl.ControlMac(bytes(32)) if kind == "tagged" else None
                dec = ctl.ControlDecoder()
                if kind == "tagged":
                    dec.key(ctl.ControlMac(bytes(32)))
                t = time.perf_counter()
                for _ in range(n):
                    dec.feed(ctl.encode(msg, send))
                times[kind].append((time.perf_counter() - t) / n * 1e6)
        plain, tagged = statistics.median(times["plain"]), statistics.median(times["tagged"])
        rows.append({"message": name, "plain_us": plain, "tagged_us": tagged, "ratio": tagged / plain,
                     "extra_us": tagged - plain, "plain_bytes": len(ctl.encode(msg)),
                     "tagged_bytes": len(ctl.encode(msg, ctl.ControlMac(bytes(32))))})
    return rows


def guard_cost(elements: int, workers: int, repeats: int) -> dict[str, float]:
    """Median ms of the server's reduce without and with the aggregation guard, alternating."""
    from dblp.protocol.reduce import guarded_mean_norm, reduce_mean_norm

    rng = np.random.default_rng(0)
    bufs = [rng.standard_normal(elements).astype(np.float32) for _ in range(workers)]
    lay = wire.ChunkLayout(elements)
    masks = [np.ones(lay.chunks, bool)] * workers
    out = np.empty(elements, np.float32)
    t: dict[str, list[float]] = {"plain_ms": [], "guarded_ms": []}
    for _ in range(repeats):
        for name, fn in (("plain_ms", reduce_mean_norm), ("guarded_ms", guarded_mean_norm)):
            t0 = time.perf_counter()
            fn(bufs, masks, lay, out)
            t[name].append((time.perf_counter() - t0) * 1e3)
    r = {k: statistics.median(v) for k, v in t.items()}
    r["ratio"] = r["guarded_ms"] / r["plain_ms"]
    r["ratios_min"] = min(g / p for g, p in zip(t["guarded_ms"], t["plain_ms"]))
    r["ratios_max"] = max(g / p for g, p in zip(t["guarded_ms"], t["plain_ms"]))
    return r


@contextlib.contextmanager
def _env(extra: dict[str, str]):
    """``extra`` in the environment the loopback's server and worker processes inherit."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv: list[str] | None = None) -> int:
    ap = parser("bench_auth.py", __doc__.splitlines()[0])
    ap.add_argument("--model", type=model_arg, default="25M", help="tensor size: " + MODEL_HELP)
    ap.add_argument("--workers", type=count_arg(1), default=3, help="worker processes of the loopback rounds")
    ap.add_argument("--iterations", type=count_arg(1), default=5, help="timed iterations (rounds) per loopback run")
    ap.add_argument("--repeats", type=count_arg(1), default=3, help="loopback runs per wire, alternating")
    ap.add_argument("--quick", action="store_true", help="1M elements, 1 repeat: a smoke run")
    ap.add_argument("--gmac-all", action="store_true",
                    help="time the rounds with every GMAC implementation of the C helper (default: the one it uses)")
    ap.add_argument("--no-rounds", action="store_true",
                    help="skip the loopback rounds (part 2): the per-datagram and per-message costs only")
    ap.add_argument("--out", type=Path, default=Path("results/bench_auth"), help="folder for the CSV and JSON")
    a = ap.parse_args(argv)
    elements = model_elements("1M" if a.quick else a.model)
    repeats = 1 if a.quick else a.repeats
    cost = integrity_cost(elements, 3)
    tags = [k[len("encode_"):-3] for k in cost if k.startswith("encode_tag")]
    print(f"integrity work, {elements:,} float32 elements (ns per datagram, median of 3):")
    print(f"  {'':16s} {'CRC-32C':>8s}" + "".join(f" {'GMAC ' + t[4:] if t != 'tag' else 'GMAC':>14s}" for t in tags))
    for what in ("encode", "check"):
        print(f"  {what + (' headers' if what == 'encode' else ' datagrams'):16s} {cost[f'{what}_crc_ns']:8.0f}"
              + "".join(f" {cost[f'{what}_{t}_ns']:14.0f}" for t in tags))
    control = control_cost(wire.ChunkLayout(elements).chunks, 5)
    print("control messages, encoded and decoded (us per message, median of 5 x 2000; the tag adds "
          f"{ctl.MAC_TRAILER} bytes to a frame):")
    print(f"  {'':28s} {'plain':>8s} {'tagged':>8s} {'ratio':>6s} {'+us':>6s} {'bytes':>13s}")
    for c in control:
        print(f"  {c['message']:28s} {c['plain_us']:8.2f} {c['tagged_us']:8.2f} {c['ratio']:6.2f} "
              f"{c['extra_us']:6.2f} {c['plain_bytes']:6d}->{c['tagged_bytes']:<6d}")
    guard = guard_cost(elements, a.workers, 7)
    print(f"the server's reduce of {a.workers} x {elements:,} floats (ms, median of 7, alternating): "
          f"{guard['plain_ms']:.2f} without the guard, {guard['guarded_ms']:.2f} with: ratio {guard['ratio']:.3f} "
          f"(range {guard['ratios_min']:.3f}-{guard['ratios_max']:.3f})")
    cost["guard"] = guard
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "bench_control_mac.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(control[0]))
        w.writeheader()
        w.writerows(control)
    if a.no_rounds:
        (a.out / "bench_auth.json").write_text(json.dumps({"elements": elements, **cost, "control": control},
                                                          indent=1) + "\n")
        return 0
    # the rounds: the authenticated wire with the default GMAC, and (--gmac-all) each other one
    impls = auth.gmac_implementations()
    auth_wires = [f"authenticated ({i})" for i in (impls if a.gmac_all else impls[:1])] or ["authenticated"]
    rows = []
    for r in range(repeats):
        order = [*auth_wires, "crc (--insecure)"]
        for wname in order if r % 2 == 0 else order[::-1]:
            impl = wname[len("authenticated ("):-1] if wname.startswith("authenticated (") else None
            env = {"DBLP_GMAC": impl} if impl else {}
            with _env(env):
                res = loopback_rounds(elements, workers=a.workers, rounds=a.iterations, warmup=1,
                                      insecure=wname.startswith("crc"))
            rows.append({"repeat": r, "wire": wname, "median_ms": res.median_s * 1e3})
            print(f"  repeat {r + 1}/{repeats}: {rows[-1]['wire']:17s} median round {rows[-1]['median_ms']:7.1f} ms",
                  flush=True)
    summary: dict[str, dict] = {}
    for wname in auth_wires:
        ratios = []
        for r in range(repeats):
            by = {x["wire"]: x["median_ms"] for x in rows if x["repeat"] == r}
            ratios.append(by[wname] / by["crc (--insecure)"])
        med = statistics.median(ratios)
        summary[wname] = {"ratios": ratios, "median_ratio": med}
        print(f"lossless {elements:,}-element rounds, {a.workers} workers on loopback: {wname} / CRC-only = "
              f"{med:.3f} (median of {repeats}; range {min(ratios):.3f}-{max(ratios):.3f}; target <= 1.10)")
    a.out.mkdir(parents=True, exist_ok=True)
    write_config(a.out, a)  # the flags as given, commit and package versions (--config takes it back)
    with open(a.out / "bench_auth.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["repeat", "wire", "median_ms"])
        w.writeheader()
        w.writerows(rows)
    (a.out / "bench_auth.json").write_text(json.dumps({"elements": elements, "workers": a.workers, **cost,
                                                       "rounds": summary, "control": control}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
