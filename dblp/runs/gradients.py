"""Synthetic gradients of a named model's size, for studying the network without the compute.

A replayed gradient is a fixed random direction per worker scaled to a
gradient-norm sequence: cheap to produce each round (one multiply) and, with
a norm sequence that has jumps, it drives the DBLP policy's CLR detection
like a real run would. Norm sequences may also be read from a training run's
export (CSV ``iteration,grad_norm``).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from traces.units import UnitError, parse_size

from dblp.protocol.wire import ParameterError

# Parameter counts the paper gives (Table I), under dblp.train's workload names.
MODEL_SIZES = {
    "efficientnet_b0": 5_000_000,
    "resnet50": 25_000_000,
    "alexnet": 61_000_000,
    "gpt2_s": 125_000_000,
}
#: Other spellings of a model's name, accepted everywhere a model is named
#: (``--model`` of every command, dblp.train's workloads, host inventories).
MODEL_ALIASES = {
    "efficientnetb0": "efficientnet_b0",
    "efficientnet": "efficientnet_b0",
    "gpt2": "gpt2_s",
    "gpt_2_s": "gpt2_s",
    "gpt2s": "gpt2_s",
    "cnn": "small_cnn",
    "digits": "small_cnn",
    "transformer": "small_transformer",
}
MODEL_HELP = "efficientnet_b0 (5M), resnet50 (25M), alexnet (61M), gpt2_s (125M) or an element count (1e6, 25M)"


def model_name(name: str) -> str:
    """The one spelling of a model's name: ``"EfficientNetB0"`` -> ``"efficientnet_b0"``."""
    key = name.strip().lower().replace("-", "_")
    return MODEL_ALIASES.get(key, key)


def model_elements(name_or_count: str | int) -> int:
    """``"resnet50"`` -> 25_000_000; ``"1e6"``, ``"1M"`` or ``1000000`` -> 1_000_000
    (counts: :func:`traces.units.parse_size`, ``M`` = 10**6)."""
    if isinstance(name_or_count, int):
        n = name_or_count
    elif model_name(name_or_count) in MODEL_SIZES:
        n = MODEL_SIZES[model_name(name_or_count)]
    else:
        try:
            n = parse_size(name_or_count, allow_zero=True)
        except UnitError:
            raise ParameterError(
                f"model must be one of {sorted(MODEL_SIZES)} or an element count, got {name_or_count!r}"
            ) from None
    if n <= 0:
        raise ParameterError(f"model size must be positive, got {n}")
    return n


def synthetic_norms(iterations: int, seed: int = 0, *, critical_every: int = 150, decay: float = 300.0) -> np.ndarray:
    """A decaying gradient-norm sequence with occasional critical jumps.

    The norm decays like 1 / (1 + t/decay) with 3% noise; every
    ``critical_every`` iterations (jittered) it jumps 2.5x for a few steps,
    a relative change above the paper's eta = 0.5, so CLR detection fires.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(iterations)
    norms = 1.0 / (1.0 + t / decay) * (1.0 + 0.03 * rng.standard_normal(iterations))
    if critical_every > 0:
        for start in range(critical_every, iterations, critical_every):
            s = start + int(rng.integers(-critical_every // 4, critical_every // 4 + 1))
            norms[max(0, s) : max(0, s) + 5] *= 2.5
    return np.abs(norms)


def read_norms(path: str | Path) -> np.ndarray:
    """Read a ``iteration,grad_norm`` CSV (the training loop's export)."""
    out: list[float] = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or "grad_norm" not in reader.fieldnames:
            raise ParameterError(f"{path}: expected a CSV header with a grad_norm column")
        for lineno, row in enumerate(reader, 2):
            try:
                out.append(float(row["grad_norm"]))
            except (TypeError, ValueError):
                raise ParameterError(f"{path}:{lineno}: grad_norm {row.get('grad_norm')!r} is not a number") from None
    if not out:
        raise ParameterError(f"{path}: no gradient norms")
    return np.asarray(out)


class ReplayGradients:
    """Per-round gradients: ``norms[r]`` times a fixed unit direction per worker."""

    def __init__(self, elements: int, worker: int, norms: np.ndarray, seed: int = 0) -> None:
        rng = np.random.default_rng([seed, worker])
        base = rng.standard_normal(elements, dtype=np.float32)
        base /= np.float32(np.linalg.norm(base))
        self.base = base
        self.norms = np.asarray(norms, dtype=np.float64)
        self._buf = np.empty_like(base)

    def __call__(self, round_no: int) -> np.ndarray:
        scale = np.float32(self.norms[round_no % self.norms.size])
        np.multiply(self.base, scale, out=self._buf)
        return self._buf
