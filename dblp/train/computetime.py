"""``python -m dblp.train.computetime``: a worker's compute per iteration (forward, backward, optimizer
step) of each named model on this machine, alone and with other processes training on the same device.

Why: the simulator's prediction of the paper's full-length runs (``python -m dblp.sim predict``) needs
each model's compute per iteration on the GPU it predicts for, and in the paper's setup three workers
may share one GPU, which is slower per worker than one alone. No exchange happens here (that is the
transport's time, calibrated separately): each process trains on the model's teacher-labelled
synthetic data (:func:`dblp.train.data.teacher_images`) for the CIFAR-shaped models, timing each step
between two device synchronisations; the first step (allocation, kernel selection) is left out.

Prints a table and writes ``--output`` JSON: ``{model: {procs: median seconds per iteration}}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time

from dblp.cli.args import parser
from traces.argtypes import count_arg


def _worker(model: str, device: str, batch: int, steps: int, seed: int, q: "mp.Queue") -> None:
    import torch

    from dblp.train import get_workload

    try:
        torch.set_num_threads(1)
        wl = get_workload(model, data="teacher", data_size=max(batch, 256), seed=seed)
        dev = torch.device(device)
        net = wl.model.to(dev).train()
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        x = wl.prepare(wl.train_set.x[:batch], dev)
        y = wl.train_set.y[:batch].to(dev)
        times = []
        for _ in range(steps + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            wl.loss(net(x), y).backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t)
        q.put(("ok", statistics.median(times[1:])))
    except Exception as exc:  # noqa: BLE001 - reported by the parent, by model
        q.put(("error", f"{type(exc).__name__}: {exc}"))


def measure(model: str, procs: int, device: str, batch: int, steps: int) -> float:
    """Median seconds per iteration of one of ``procs`` processes training ``model`` at once on ``device``."""
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    q = ctx.Queue()
    ps = [ctx.Process(target=_worker, args=(model, device, batch, steps, i, q)) for i in range(procs)]
    for p in ps:
        p.start()
    got = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join(30)
    errs = [m for k, m in got if k == "error"]
    if errs:
        raise RuntimeError(f"{model}: {errs[0]}")
    return statistics.median(v for _, v in got)


def build_parser() -> argparse.ArgumentParser:
    ap = parser("python -m dblp.train.computetime", __doc__.splitlines()[0], config=False)
    ap.add_argument("--models", default="efficientnet_b0,resnet50", help="models (comma list; teacher data: "
                                                                         "efficientnet_b0, resnet50, alexnet)")
    ap.add_argument("--procs", default="1,3", help="processes training at once on the device (comma list)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: cuda when present")
    ap.add_argument("--batch", type=count_arg(1), default=128, help="mini-batch per process (the paper's: 128)")
    ap.add_argument("--steps", type=count_arg(1), default=10, help="timed iterations per process (after one untimed)")
    ap.add_argument("--output", default=None, help="JSON file to write {model: {procs: seconds}}")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    import torch

    from dblp.train.models import TEACHER_WORKLOADS

    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("argument --device: cuda, but torch sees no CUDA device")
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in TEACHER_WORKLOADS]
    if bad:
        ap.error(f"argument --models: {', '.join(bad)}: one of {', '.join(TEACHER_WORKLOADS)}")
    try:
        procs = [int(p) for p in a.procs.split(",")]
        assert procs and all(p >= 1 for p in procs)
    except (ValueError, AssertionError):
        ap.error(f"argument --procs: {a.procs!r}: a comma list of process counts >= 1")
    out: dict[str, dict[str, float]] = {}
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    print(f"compute per iteration (forward, backward, SGD step), batch {a.batch}, median of {a.steps} steps, on {name}:")
    for m in models:
        out[m] = {}
        for n in procs:
            try:
                s = measure(m, n, device, a.batch, a.steps)
            except (RuntimeError, OSError) as exc:
                print(f"  {m:16s} {n} process(es): failed: {exc}", file=sys.stderr)
                continue
            out[m][str(n)] = s
            print(f"  {m:16s} {n} process(es) at once: {s * 1e3:8.2f} ms per iteration each", flush=True)
    if a.output:
        with open(a.output, "w") as fh:
            json.dump({**out, "_device": name, "_batch": a.batch}, fh, indent=1)
    return 0 if all(out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
