"""Per-step time of DDP over DBLP against plain DDP, side by side under ``torchrun`` on CPU.

Why this exists: a fixed cost per step for small models was measured
(3 ranks, a 10,762-parameter model: +2.6 to +3.9 ms over plain DDP). A
fixed cost is invisible in a 25M-element round and dominates a 10k one, so
it is measured on its own, with the same model and data in both arms:

* every rank builds the same model twice, wrapped twice in
  ``DistributedDataParallel``: once plain (gloo all-reduce), once with
  :class:`dblp.train.DBLPComm` (one DBLP round per step);
* the two arms run in alternating blocks of ``block`` steps after
  ``warmup`` untimed steps each, so load on a shared machine falls on both
  alike; a step is ``zero_grad``, forward, backward (the exchange) and
  ``opt.step``, timed on every rank;
* a step's time is the slowest rank's (the ranks wait for each other in the
  exchange anyway); the result is the median over the timed steps of each
  arm, and the difference of the medians is the overhead.

Run one measurement (3 ranks, prints one JSON line)::

    python -m dblp.train.ddpbench --ranks 3 --steps 200

or from Python: :func:`ddp_overhead`. ``scenarios/benchmark.py --targets``
prints it against the speed target (<= +1 ms per step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from dblp.protocol.policy import POLICIES
from traces.argtypes import count_arg
from traces.units import duration_arg

_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the dblp package

#: the small model whose step the target is stated for: Linear(73, 128), ReLU, Linear(128, 10) = 10,762 parameters (30 chunks at MTU 1500)
SMALL_MODEL_PARAMS = 10_762
#: the speed target: DBLP's step at most this much slower than plain DDP's
OVERHEAD_TARGET_S = 0.001
#: ``--hostlocal``: the DBLP arm's data path (DBLPComm's ``local``: auto, True, False)
LOCAL_CHOICES = ("auto", "on", "off")


@dataclass
class DdpOverhead:
    """Per-step times (seconds, slowest rank) of both arms, and what ran."""

    ranks: int
    params: int
    plain_s: list[float] = field(default_factory=list)
    dblp_s: list[float] = field(default_factory=list)
    control: dict = field(default_factory=dict)  # control messages rank 0's worker sent per DBLP step, by type
    local: bool | None = None  # whether rank 0's gradient went through the host-local slot (not UDP)

    @property
    def plain_median_s(self) -> float:
        return statistics.median(self.plain_s)

    @property
    def dblp_median_s(self) -> float:
        return statistics.median(self.dblp_s)

    @property
    def overhead_s(self) -> float:
        """DBLP's median step minus plain DDP's (the target's figure)."""
        return self.dblp_median_s - self.plain_median_s

    def to_dict(self) -> dict:
        return {"ranks": self.ranks, "params": self.params, "plain_median_s": self.plain_median_s,
                "dblp_median_s": self.dblp_median_s, "overhead_s": self.overhead_s, "steps": len(self.dblp_s),
                "control": self.control, "local": self.local}


def ddp_overhead(ranks: int = 3, steps: int = 200, *, block: int = 20, warmup: int = 20,
                 timeout: float = 300.0, policy: str = "dblp", local: str = "auto") -> DdpOverhead:
    """Launch ``ranks`` CPU ranks under torchrun; ``steps`` timed steps per arm. ``local``:
    :class:`~dblp.train.DBLPComm`'s data path (``auto``: shared memory on one host, ``off``:
    UDP datagrams). Raises RuntimeError with the ranks' output if the run fails."""
    if local not in LOCAL_CHOICES:
        raise ValueError(f"local must be one of {', '.join(LOCAL_CHOICES)}, got {local!r}")
    if ranks < 1 or steps < 1 or block < 1 or warmup < 0:
        raise ValueError(f"need ranks, steps, block >= 1 and warmup >= 0 (got {ranks}, {steps}, {block}, {warmup})")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="dblp-ddpbench-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                "-m", "dblp.train.ddpbench", "--rank-main", "--steps", str(steps), "--block", str(block),
                "--warmup", str(warmup), "--policy", policy, "--hostlocal", local, "--out", str(out)]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the DDP benchmark ({ranks} ranks, {steps} steps) did not end within "
                               f"{timeout:g} s") from None
        if r.returncode != 0 or not out.exists():
            raise RuntimeError(f"the DDP benchmark exited with {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
        d = json.loads(out.read_text())
    return DdpOverhead(ranks, d["params"], d["plain_s"], d["dblp_s"], d.get("control", {}), d.get("local"))


# -- one rank (run by torchrun) ---------------------------------------------------------------
def _rank_main(steps: int, block: int, warmup: int, policy: str, local: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dblp.train.comm import DBLPComm

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(73, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    plain, hooked = DDP(build()), DDP(build())
    params = sum(p.numel() for p in plain.parameters())
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(32, 73, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    arms = {"plain": (plain, torch.optim.SGD(plain.parameters(), lr=0.01)),
            "dblp": (hooked, torch.optim.SGD(hooked.parameters(), lr=0.01))}
    times: dict[str, list[float]] = {"plain": [], "dblp": []}
    with DBLPComm(hooked, policy=policy, port=0, records=None,
                  local={"auto": "auto", "on": True, "off": False}[local]) as comm:
        def run(arm: str, n: int, keep: bool) -> None:
            model, opt = arms[arm]
            for _ in range(n):
                t0 = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                if keep:
                    times[arm].append(time.perf_counter() - t0)

        for arm in arms:
            run(arm, warmup, False)
        sent0 = dict(getattr(comm.worker.peer, "control_sent", {}))  # this rank's control messages, by type
        done = 0
        while done < steps:
            n = min(block, steps - done)
            for arm in arms:
                run(arm, n, True)
            done += n
        # per DBLP step (the timed ones)
        control = {k: (v - sent0.get(k, 0)) / steps for k, v in getattr(comm.worker.peer, "control_sent", {}).items()}
        # the slowest rank's time of each step
        t = torch.tensor([times["plain"], times["dblp"]], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(out).write_text(json.dumps({"params": params, "world": world, "plain_s": t[0].tolist(),
                                         "dblp_s": t[1].tolist(), "control": control, "local": comm.local}))
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dblp.train.ddpbench",
                                 description="Per-step time of DDP over DBLP against plain DDP (CPU, torchrun), "
                                             "a 10,762-parameter model; prints one JSON line.")
    ap.add_argument("--ranks", type=count_arg(1), default=3, help="torchrun processes (default 3)")
    ap.add_argument("--steps", type=count_arg(1), default=200, help="timed steps per arm (default 200)")
    ap.add_argument("--block", type=count_arg(1), default=20,
                    help="steps per block; arms alternate by block (default 20)")
    ap.add_argument("--warmup", type=count_arg(0), default=20, help="untimed steps per arm first (default 20)")
    ap.add_argument("--policy", choices=POLICIES, default="dblp", help="DBLP tolerance policy (default dblp)")
    ap.add_argument("--hostlocal", choices=LOCAL_CHOICES, default="auto",
                    help="the DBLP arm's data path: auto (shared memory, dblp.transport.hostlocal, when the server is on "
                         "this host - here it always is), on, or off (UDP datagrams over loopback) (default auto)")
    ap.add_argument("--timeout", type=duration_arg(allow_zero=False), default="300s",
                    help="time for the whole run, e.g. 300s; a bare number is seconds (default 300 s)")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)  # one torchrun rank
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank_main:
        _rank_main(a.steps, a.block, a.warmup, a.policy, a.hostlocal, a.out)
        return 0
    try:
        res = ddp_overhead(a.ranks, a.steps, block=a.block, warmup=a.warmup, timeout=a.timeout, policy=a.policy,
                           local=a.hostlocal)
    except (ValueError, RuntimeError) as exc:
        print(f"ddpbench: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(res.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
