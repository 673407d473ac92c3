"""The training runs the convergence models (:mod:`dblp.sim.convergence.phase`) are fitted to.

Why a file of runs: the fit, its documented error and the tests must not
need torch or many minutes of training, so the runs are measured once
(``python -m dblp.sim.convergence.phase measure``, which calls
:func:`measure_phases`) and shipped as a CSV (:data:`PHASE_DATA`, one row per
run and evaluation, and the clean runs' gradient norms beside it,
:data:`PHASE_NORMS`).

A run trains a CPU-sized workload (:data:`PHASE_WORKLOADS`) with its
defaults and 3 simulated workers (:func:`dblp.train.train`) while
:class:`dblp.train.exchange.DropExchange` zeroes, in every iteration its
:class:`Schedule` names, exactly ``round(f * chunks)`` random chunks of the
averaged gradient; the test accuracy is taken before training and every 5
iterations. :data:`PHASE_SETTINGS` are the schedules,
:data:`PHASE_FIT_SETTINGS` those the models are fitted to (the others are
held out to measure their error). :func:`load_curves` also reads the
emulation's training runs (``curves.csv``), whose loss is measured per
iteration.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

#: the phase-aware model's runs (:func:`measure_phases`): several workloads, loss by CLR regime
PHASE_DATA = Path(__file__).with_name("data") / "convergence_phases.csv"
#: ... and each seed's clean-run gradient norms, from which the iterations' regimes are labelled
PHASE_NORMS = Path(__file__).with_name("data") / "convergence_phases_norms.csv"
#: the workloads of PHASE_DATA (CPU-sized: a 300-iteration run takes seconds to half a minute)
PHASE_WORKLOADS = ("digits_mlp", "small_cnn")
#: the regime labels come from DBLP's own detector (dblp.protocol.policy.DblpPolicy) at the paper's eta and our freq
REF_ETA = 0.5
REF_FREQ = 10


@dataclass(frozen=True)
class Schedule:
    """Loss ``fraction`` in iterations ``start <= i < end`` with ``(i - start) % every == 0``; 0 elsewhere.

    ``phase`` restricts the loss to the iterations of one gradient-norm regime: ``crit`` (those DBLP's CLR
    detector, :func:`clr_labels`, puts in the critical regime), ``calm`` (the others) or ``any``."""

    name: str
    fraction: float
    start: int = 0
    end: int = 10**9
    every: int = 1
    phase: str = "any"

    def at(self, i: int, critical: bool = False) -> float:
        if self.phase != "any" and (self.phase == "crit") != bool(critical):
            return 0.0
        return self.fraction if self.start <= i < self.end and (i - self.start) % self.every == 0 else 0.0


#: the phase-aware model's schedules (:func:`measure_phases`): loss only in the critical or only in the calm
#: iterations at two fractions, beside uniform and windowed loss
PHASE_SETTINGS: tuple[Schedule, ...] = (
    Schedule("clean", 0.0),
    Schedule("const 0.4", 0.4),
    Schedule("const 0.8", 0.8),
    Schedule("crit 0.8", 0.8, phase="crit"),
    Schedule("calm 0.8", 0.8, phase="calm"),
    Schedule("crit 0.5", 0.5, phase="crit"),
    Schedule("calm 0.5", 0.5, phase="calm"),
    Schedule("early 0.8", 0.8, 0, 40),
    Schedule("late 0.8", 0.8, 120, 300),
    Schedule("bursts 0.9/4", 0.9, 0, 300, 4),
)
#: ... those it is fitted to; the rest (const 0.4, crit 0.5, calm 0.5, bursts 0.9/4) are held out
PHASE_FIT_SETTINGS = ("clean", "const 0.8", "crit 0.8", "calm 0.8", "early 0.8", "late 0.8")


def clr_labels(norms: Sequence[float], eta: float = REF_ETA, freq: int = REF_FREQ) -> list[bool]:
    """Per iteration, whether DBLP's CLR detector (:class:`dblp.protocol.policy.DblpPolicy`) has the critical regime in
    force for it: iteration i is exchanged under the state the norms of iterations < i left (the start is
    critical until the first check), as in a DBLP run. Why DBLP's own detector: the phase the model charges
    loss by must be the one DBLP acts on, or the model cannot say whether acting on it pays."""
    from dblp.protocol.policy import DblpPolicy

    pol = DblpPolicy(eta=eta, freq=freq)
    out = []
    for i, x in enumerate(norms):
        out.append(bool(pol.clr))
        pol.update(i, float(x))
    return out


class _Stop(Exception):
    """Ends a training run of :func:`measure_phases` after its iterations."""


@dataclass
class Curve:
    """One training run: its loss schedule and the test accuracy after ``iterations[j]`` iterations."""

    setting: str
    seed: int
    schedule: Schedule
    iterations: list[int]
    accuracy: list[float]
    lost: list[float] | None = None  # measured per-iteration lost fractions (an emulation run), else the schedule's
    workload: str = "digits_mlp"
    labels: list[bool] | None = None  # per iteration: in DBLP's critical regime (clr_labels), where known

    def fractions(self) -> list[float]:
        n = max(self.iterations)
        if self.lost is not None:
            return (list(self.lost) + [0.0] * n)[:n]
        lab = self.critical()
        return [self.schedule.at(i, lab[i]) for i in range(n)]

    def critical(self) -> list[bool]:
        """The regime label of each iteration (all calm where the run has none)."""
        n = max(self.iterations)
        return (list(self.labels or []) + [False] * n)[:n]


def measure_phases(out: Path = PHASE_DATA, *,
                   workloads: Sequence[str] = PHASE_WORKLOADS, iterations: int = 300, every: int = 5,
                   seeds: Sequence[int] = (0, 1, 2), workers: int = 3, settings: Sequence[Schedule] = PHASE_SETTINGS,
                   progress: Callable[[str], None] = print) -> None:
    """Train each workload under every :data:`PHASE_SETTINGS` schedule and seed (needs torch; CPU, one thread).

    Each seed's clean run goes first: its gradient norms (written beside ``out``, :func:`norms_path`) label the
    iterations critical or calm (:func:`clr_labels`), and the ``crit``/``calm`` schedules of that seed drop only in
    those iterations - the same seed gives the same initialisation and data order, so the runs differ only
    in the drop. One row per run and evaluation (``workload, setting, fraction, start, end, every, phase, seed,
    workers, batch_size, iteration, accuracy``)."""
    import dataclasses
    import time

    import torch

    from dblp.train import DropExchange, TrainConfig, get_workload, iterations_per_epoch, train

    torch.set_num_threads(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    cols = ["workload", "setting", "fraction", "start", "end", "every", "phase", "seed", "workers", "batch_size",
            "iteration", "accuracy"]
    ordered = sorted(settings, key=lambda s: s.name != "clean")  # the clean run labels the others
    with open(out, "w", newline="", encoding="utf-8") as fh, \
            open(norms_path(out), "w", newline="", encoding="utf-8") as nh:
        w, nw = csv.writer(fh), csv.writer(nh)
        w.writerow(cols)
        nw.writerow(["workload", "seed", "iteration", "grad_norm"])
        for name in workloads:
            for seed in seeds:
                labels: list[bool] = []
                for sch in ordered:
                    t0 = time.perf_counter()
                    wl = get_workload(name, seed=seed)
                    cfg = TrainConfig.for_workload(wl, sim_workers=workers, seed=seed, device="cpu")
                    cfg = dataclasses.replace(cfg, epochs=math.ceil(iterations / iterations_per_epoch(wl, cfg)))
                    rows: list[tuple[int, float]] = [(0, wl.evaluate(wl.model, torch.device("cpu"))["accuracy"])]
                    norms: list[float] = []

                    def on_iteration(rec: dict) -> None:
                        n = rec["iteration"] + 1
                        norms.append(float(rec["grad_norm"]))
                        if n % every == 0:
                            rows.append((n, wl.evaluate(wl.model, torch.device("cpu"))["accuracy"]))
                        if n >= iterations:
                            raise _Stop

                    lab = labels
                    try:
                        train(wl, DropExchange(lambda i: sch.at(i, i < len(lab) and lab[i]), seed=10_000 + seed),
                              cfg, on_iteration=on_iteration)
                    except _Stop:
                        pass
                    if sch.name == "clean":
                        labels = clr_labels(norms)
                        for i, x in enumerate(norms):
                            nw.writerow([name, seed, i, f"{x:.6g}"])
                        nh.flush()
                    for n, acc in rows:
                        end = min(sch.end, iterations)
                        w.writerow([name, sch.name, sch.fraction, sch.start, end, sch.every, sch.phase, seed, workers,
                                    cfg.batch_size, n, f"{acc:.6f}"])
                    fh.flush()
                    progress(f"{name} seed {seed} {sch.name:<13} acc@{every}: {rows[1][1]:.3f} "
                             f"@{iterations}: {rows[-1][1]:.3f} ({time.perf_counter() - t0:.1f} s)")


def load_norms(path: Path = PHASE_NORMS) -> dict[tuple[str, int], list[float]]:
    """(workload, seed) -> the clean run's per-iteration gradient norms (a file of :func:`measure_phases`)."""
    out: dict[tuple[str, int], list[float]] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            out.setdefault((r["workload"], int(r["seed"])), []).append(float(r["grad_norm"]))
    return out


def load_curves(path: Path) -> list[Curve]:
    """The runs in a file written by :func:`measure_phases` (with the regime labels of
    the norms file beside it, :func:`norms_path`), or by the emulation's training scenarios
    (:func:`dblp.results.trainreport.write_curves`: ``setting, seed, workers, batch_size, iteration,
    lost_fraction, train_s, accuracy``, one row per iteration, the accuracy where evaluated)."""
    with open(path, newline="", encoding="utf-8") as fh:
        rd = csv.DictReader(fh)
        if "lost_fraction" in (rd.fieldnames or []):
            return _measured_curves(rd)
        by_wl: dict[tuple[str, str, int], Curve] = {}
        for r in rd:
            wl = r.get("workload") or "digits_mlp"
            key = (wl, r["setting"], int(r["seed"]))
            c = by_wl.get(key)
            if c is None:
                sch = Schedule(r["setting"], float(r["fraction"]), int(r["start"]), int(r["end"]), int(r["every"]),
                               r.get("phase") or "any")
                c = by_wl[key] = Curve(r["setting"], int(r["seed"]), sch, [], [], workload=wl)
            c.iterations.append(int(r["iteration"]))
            c.accuracy.append(float(r["accuracy"]))
    curves = list(by_wl.values())
    norms_file = norms_path(path)
    if "workload" in (rd.fieldnames or []) and norms_file.exists():
        norms = load_norms(norms_file)
        for c in curves:
            if (c.workload, c.seed) in norms:
                c.labels = clr_labels(norms[(c.workload, c.seed)])
    return curves


def norms_path(curves: Path) -> Path:
    """Where :func:`measure_phases` writes the norms of a curve file: beside it, ``<name>_norms.csv``."""
    return curves.with_name(f"{curves.stem}_norms{curves.suffix}")


def _measured_curves(rows: Iterable[dict[str, str]]) -> list[Curve]:
    """Curves with measured lost fractions; each run gets its own :class:`Schedule` (named by setting
    and seed, its ``fraction`` the run's mean loss) so the model predicts each run separately. An optional
    ``critical`` column (0/1, :func:`write_measured`) gives each iteration's regime label."""
    acc: dict[tuple[str, int], list[tuple[int, float]]] = {}
    lost: dict[tuple[str, int], list[float]] = {}
    crit: dict[tuple[str, int], list[bool]] = {}
    for r in rows:
        key = (r["setting"], int(r["seed"]))
        if r["lost_fraction"] != "":
            lost.setdefault(key, []).append(float(r["lost_fraction"]))
            if r.get("critical", "") != "":
                crit.setdefault(key, []).append(r["critical"] == "1")
        if r["accuracy"] != "":
            acc.setdefault(key, []).append((int(r["iteration"]), float(r["accuracy"])))
    out = []
    for key, points in acc.items():
        fr = lost.get(key, [])
        mean = sum(fr) / len(fr) if fr else 0.0
        sch = Schedule(f"{key[0]} seed {key[1]}", mean)
        out.append(Curve(key[0], key[1], sch, [p[0] for p in points], [p[1] for p in points], fr,
                         labels=crit.get(key)))
    return out


def write_measured(curves: Sequence[Curve], path: Path) -> Path:
    """Runs with measured losses as a curve file :func:`load_curves` reads back, with each iteration's regime
    label (``critical``): how an emulated run's check travels without its run folder's records."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["setting", "seed", "workers", "batch_size", "iteration", "lost_fraction", "critical", "train_s",
                    "accuracy"])
        for c in curves:
            at = dict(zip(c.iterations, c.accuracy))
            lost, lab = list(c.lost or []), c.critical()
            for i in range(max(len(lost), max(c.iterations) + 1)):
                w.writerow([c.setting, c.seed, "", "", i, f"{lost[i]:.6f}" if i < len(lost) else "",
                            int(lab[i]) if i < len(lab) else "", "", f"{at[i]:.6f}" if i in at else ""])
    return path


def split(curves: Sequence[Curve],
          fit_settings: Sequence[str] = PHASE_FIT_SETTINGS) -> tuple[list[Curve], list[Curve]]:
    """The runs of ``fit_settings`` (default :data:`PHASE_FIT_SETTINGS`) and the held-out ones."""
    return [c for c in curves if c.setting in fit_settings], [c for c in curves if c.setting not in fit_settings]
