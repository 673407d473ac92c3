"""A worker process for transport tests: sends integer-valued gradients and
checks every averaged result chunk by chunk.

Worker i sends (i+1) * k_r, where k_r holds random nonzero integers, so every
partial sum is exact in float32: a chunk of the result must equal
float32(s * k) * float32(1/N) bit for bit, where s is the sum of (i+1) over
the workers whose chunk reached the server (s = N(N+1)/2 when all did), or be
all zeros when the broadcast chunk itself was lost. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from dblp.transport.worker import Worker


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--elements", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--peer-timeout", type=float, default=30.0)
    a = ap.parse_args()
    n, N = a.elements, a.workers
    inv = np.float32(1.0 / N)
    full = N * (N + 1) // 2
    report = {"id": a.id, "rounds": 0, "exact_rounds": 0, "bad_chunks": 0, "min_down_frac": 1.0,
              "min_full_frac": 1.0, "tolerances": [], "up_fracs": []}
    with Worker(a.host, a.port, elements=n, worker_id=a.id, fast=False if a.plain else None,
                peer_timeout=a.peer_timeout) as w:
        lay = w.layout
        report["mtu"] = lay.mtu  # the MTU the server sized the datagrams for (--mtu auto's choice)
        cf = lay.chunk_floats
        pad = lay.chunks * cf
        for r in range(a.rounds):
            k = np.random.default_rng(r).integers(1, 1000, n).astype(np.float32)
            k *= np.where(np.random.default_rng(r + 10_000).random(n) < 0.5, -1, 1).astype(np.float32)
            out = w.allreduce(k * np.float32(a.id + 1))
            kp = np.zeros(pad, np.float32); kp[:n] = k
            op = np.zeros(pad, np.float32); op[:n] = out
            K, O = kp.reshape(-1, cf), op.reshape(-1, cf)
            s = np.rint(O[:, 0] * N / K[:, 0]).astype(np.int64)  # K never 0
            exp = (s[:, None].astype(np.float32) * K) * inv
            bad = ~(exp == O).all(axis=1) | (s < 0) | (s > full)
            recv = w.peer.receiver.mask  # chunks of the broadcast that arrived
            bad |= (~recv) & (O != 0).any(axis=1)
            report["bad_chunks"] += int(bad.sum())
            report["exact_rounds"] += int(bool((s == full).all() and not bad.any()))
            report["min_down_frac"] = min(report["min_down_frac"], float(recv.mean()))
            report["min_full_frac"] = min(report["min_full_frac"], float((s == full).mean()))
            rec = w.last_record
            report["tolerances"].append([rec.tolerance_up, rec.tolerance_down])
            report["up_fracs"].append(rec.up_frac)
            report["rounds"] += 1
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
