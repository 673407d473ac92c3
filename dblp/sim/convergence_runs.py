"""The training runs the convergence model (:mod:`dblp.sim.convergence`) is fitted to.

Why a file of runs: the fit, its documented error and the tests must not
need torch or 13 minutes of training, so the runs are measured once
(``python -m dblp.sim.convergence measure``, which calls :func:`measure`)
and shipped as a CSV (:data:`DATA`, one row per run and evaluation:
``setting, fraction, start, end, every, seed, workers, batch_size,
iteration, accuracy``).

A run trains ``digits_mlp`` with its defaults and 3 simulated workers
(:func:`dblp.train.train`) while :class:`dblp.train.exchange.DropExchange`
zeroes, in every iteration its :class:`Schedule` names, exactly
``round(f * chunks)`` random chunks of the averaged gradient; the test
accuracy is taken before training and every 5 iterations. :data:`SETTINGS`
are the schedules, :data:`FIT_SETTINGS` those the model is fitted to (the
others are held out to measure its error).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

DATA = Path(__file__).with_name("data") / "convergence_digits_mlp.csv"


@dataclass(frozen=True)
class Schedule:
    """Loss ``fraction`` in iterations ``start <= i < end`` with ``(i - start) % every == 0``; 0 elsewhere."""

    name: str
    fraction: float
    start: int = 0
    end: int = 10**9
    every: int = 1

    def at(self, i: int) -> float:
        return self.fraction if self.start <= i < self.end and (i - self.start) % self.every == 0 else 0.0


SETTINGS: tuple[Schedule, ...] = (
    Schedule("clean", 0.0),
    Schedule("const 0.2", 0.2),
    Schedule("const 0.4", 0.4),
    Schedule("const 0.6", 0.6),
    Schedule("const 0.8", 0.8),
    Schedule("early 0.4", 0.4, 0, 40),
    Schedule("early 0.8", 0.8, 0, 40),
    Schedule("mid 0.4", 0.4, 40, 120),
    Schedule("mid 0.8", 0.8, 40, 120),
    Schedule("late 0.4", 0.4, 120, 300),
    Schedule("late 0.8", 0.8, 120, 300),
    Schedule("bursts 0.7/10", 0.7, 0, 300, 10),
    Schedule("bursts 0.9/4", 0.9, 0, 300, 4),
)
#: the schedules the parameters are fitted to; the rest are held out
FIT_SETTINGS = ("clean", "const 0.2", "const 0.8", "early 0.8", "mid 0.4", "late 0.8", "bursts 0.9/4")


class _Stop(Exception):
    """Ends a training run of :func:`measure` after its iterations."""


@dataclass
class Curve:
    """One training run: its loss schedule and the test accuracy after ``iterations[j]`` iterations."""

    setting: str
    seed: int
    schedule: Schedule
    iterations: list[int]
    accuracy: list[float]
    lost: list[float] | None = None  # measured per-iteration lost fractions (an emulation run), else the schedule's

    def fractions(self) -> list[float]:
        n = max(self.iterations)
        if self.lost is not None:
            return (list(self.lost) + [0.0] * n)[:n]
        return [self.schedule.at(i) for i in range(n)]


def measure(out: Path, *, iterations: int = 300, every: int = 5, seeds: Sequence[int] = (0, 1, 2), workers: int = 3,
            settings: Sequence[Schedule] = SETTINGS, progress: Callable[[str], None] = print) -> None:
    """Train ``digits_mlp`` under every schedule and seed; write the accuracy curves as CSV (needs torch).

    The test accuracy is taken before training and after every ``every`` iterations (from the
    iteration callback, so the data order and epochs are those of an ordinary run)."""
    import dataclasses
    import time

    import torch

    from ..train import DropExchange, TrainConfig, get_workload, iterations_per_epoch, train

    torch.set_num_threads(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    cols = ["setting", "fraction", "start", "end", "every", "seed", "workers", "batch_size", "iteration", "accuracy"]
    with open(out, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for seed in seeds:
            for sch in settings:
                t0 = time.perf_counter()
                wl = get_workload("digits_mlp", seed=seed)
                cfg = TrainConfig.for_workload(wl, sim_workers=workers, seed=seed, device="cpu")
                cfg = dataclasses.replace(cfg, epochs=math.ceil(iterations / iterations_per_epoch(wl, cfg)))
                rows: list[tuple[int, float]] = [(0, wl.evaluate(wl.model, torch.device("cpu"))["accuracy"])]

                def on_iteration(rec: dict) -> None:
                    n = rec["iteration"] + 1
                    if n % every == 0:
                        rows.append((n, wl.evaluate(wl.model, torch.device("cpu"))["accuracy"]))
                    if n >= iterations:
                        raise _Stop

                try:
                    train(wl, DropExchange(sch.at, seed=10_000 + seed), cfg, on_iteration=on_iteration)
                except _Stop:
                    pass
                for n, acc in rows:
                    end = min(sch.end, iterations)
                    w.writerow([sch.name, sch.fraction, sch.start, end, sch.every, seed, workers, cfg.batch_size, n,
                                f"{acc:.6f}"])
                fh.flush()
                progress(f"seed {seed} {sch.name:<14} acc@{every}: {rows[1][1]:.3f} @{iterations}: {rows[-1][1]:.3f} "
                         f"({time.perf_counter() - t0:.1f} s)")


def load_curves(path: Path = DATA) -> list[Curve]:
    """The runs in a file written by :func:`measure`, or by the emulation's training scenarios
    (:func:`dblp.trainreport.write_curves`: ``setting, seed, workers, batch_size, iteration,
    lost_fraction, train_s, accuracy``, one row per iteration, the accuracy where evaluated)."""
    by: dict[tuple[str, int], Curve] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        rd = csv.DictReader(fh)
        if "lost_fraction" in (rd.fieldnames or []):
            return _measured_curves(rd)
        for r in rd:
            key = (r["setting"], int(r["seed"]))
            c = by.get(key)
            if c is None:
                sch = Schedule(r["setting"], float(r["fraction"]), int(r["start"]), int(r["end"]), int(r["every"]))
                c = by[key] = Curve(r["setting"], int(r["seed"]), sch, [], [])
            c.iterations.append(int(r["iteration"]))
            c.accuracy.append(float(r["accuracy"]))
    return list(by.values())


def _measured_curves(rows: Iterable[dict[str, str]]) -> list[Curve]:
    """Curves with measured lost fractions; each run gets its own :class:`Schedule` (named by setting
    and seed, its ``fraction`` the run's mean loss) so the model predicts each run separately."""
    acc: dict[tuple[str, int], list[tuple[int, float]]] = {}
    lost: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        key = (r["setting"], int(r["seed"]))
        if r["lost_fraction"] != "":
            lost.setdefault(key, []).append(float(r["lost_fraction"]))
        if r["accuracy"] != "":
            acc.setdefault(key, []).append((int(r["iteration"]), float(r["accuracy"])))
    out = []
    for key, points in acc.items():
        fr = lost.get(key, [])
        mean = sum(fr) / len(fr) if fr else 0.0
        sch = Schedule(f"{key[0]} seed {key[1]}", mean)
        out.append(Curve(key[0], key[1], sch, [p[0] for p in points], [p[1] for p in points], fr))
    return out


def split(curves: Sequence[Curve]) -> tuple[list[Curve], list[Curve]]:
    """The runs of :data:`FIT_SETTINGS` and the held-out ones."""
    return [c for c in curves if c.setting in FIT_SETTINGS], [c for c in curves if c.setting not in FIT_SETTINGS]
