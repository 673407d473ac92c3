"""MNIST-1D, built offline from its templates: the data of the ``mnist1d_cnn`` workload.

Why this data set: the bundled 8x8 digits are learnt in ~60 iterations, so a
phase-aware protocol has almost no late phase to act in. MNIST-1D (Greydanus
and Kobak, 2020, arXiv 2011.14439; the ``mnist1d`` package on PyPI, Apache-2.0)
is a 40-sample 1-D signal per example, made from ten hand-written digit
templates by padding, dilation, scaling, translation, correlated and i.i.d.
noise and shear: small enough for 2 cores, hard enough that a small CNN keeps
improving for ~1,000 iterations (measured: ``docs/training.md``).

Nothing is downloaded. ``mnist1d.data.get_dataset`` would fetch a pickle from
GitHub; this module never calls it and builds the set with
``mnist1d.data.make_dataset`` (pure numpy/scipy from the templates that ship
in the package), from a seed. The package draws from numpy's *global* legacy
generator (``np.random.seed``); :func:`build_mnist1d` saves and restores that
state (and Python's ``random``), so building the data does not reseed the
caller.

Generating 12,000 signals takes ~10-20 s on a loaded 2-core machine, and every
training worker of an emulation builds its workload, so the arrays are cached
in an ``.npz`` (:func:`cache_dir`) keyed by the package version and every
argument; a cache that cannot be read or written is skipped (the data is then
generated in memory).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from dblp.train.data import ArrayDataset

__all__ = [
    "MNIST1D_VERSION",
    "MNIST1D_SAMPLES",
    "MNIST1D_SEED",
    "MNIST1D_LENGTH",
    "mnist1d_args",
    "build_mnist1d",
    "cache_dir",
    "cache_path",
]

#: the package version the data was measured with; ``pyproject.toml`` pins it, since the set is
#: whatever this version's ``make_dataset`` draws from a seed
MNIST1D_VERSION = "0.0.2.post1"
#: signals generated (train + test): 12,000 at the package's 80/20 split gives 9,600 training
#: signals, 100 iterations an epoch for 3 workers at batch 32, and a 2,400-signal test set
MNIST1D_SAMPLES = 12_000
#: the package's own default seed (``get_dataset_args().seed``)
MNIST1D_SEED = 42
#: samples per signal (``final_seq_length``)
MNIST1D_LENGTH = 40

_GEN_LOCK = threading.Lock()  # numpy's global generator is process-wide: one build at a time


#: ``mnist1d.data.get_dataset_args()`` of the pinned version, less its download URL: written out
#: here so that the cache key needs no import of the package (it imports matplotlib, ~2 s)
_DEFAULT_ARGS: dict[str, Any] = {
    "num_samples": 5000, "train_split": 0.8, "template_len": 12, "padding": [36, 60], "scale_coeff": 0.4,
    "max_translation": 48, "corr_noise_scale": 0.25, "iid_noise_scale": 2e-2, "shear_scale": 0.75,
    "shuffle_seq": False, "final_seq_length": MNIST1D_LENGTH, "seed": 42,
}


def mnist1d_args(num_samples: int = MNIST1D_SAMPLES, seed: int = MNIST1D_SEED) -> dict[str, Any]:
    """The package's default generation arguments with ``num_samples`` and ``seed`` replaced."""
    return {**_DEFAULT_ARGS, "padding": list(_DEFAULT_ARGS["padding"]), "num_samples": int(num_samples),
            "seed": int(seed)}


def cache_dir() -> Path:
    """Where built sets are kept: ``$DBLP_CACHE_DIR``, else ``$XDG_CACHE_HOME/dblp``, else
    ``~/.cache/dblp``."""
    env = os.environ.get("DBLP_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dblp"


def cache_path(num_samples: int = MNIST1D_SAMPLES, seed: int = MNIST1D_SEED) -> Path:
    """The cache file of one set: the package version and a digest of every generation argument
    in its name, so a changed argument or version never reads another set's arrays."""
    digest = hashlib.sha256(json.dumps(mnist1d_args(num_samples, seed), sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / f"mnist1d-{MNIST1D_VERSION}-n{num_samples}-s{seed}-{digest}.npz"


def _generate(num_samples: int, seed: int) -> dict[str, np.ndarray]:
    """``mnist1d.data.make_dataset`` with the caller's global random state left as it was."""
    try:
        from mnist1d.data import make_dataset
    except ImportError as exc:
        raise ImportError("the mnist1d_cnn workload builds its data with the mnist1d package (offline, from its "
                          f"templates): pip install 'dblp-testbed[train]' or pip install mnist1d=={MNIST1D_VERSION} "
                          f"({exc})") from exc
    with _GEN_LOCK:
        np_state, py_state = np.random.get_state(), random.getstate()
        try:
            d = make_dataset(SimpleNamespace(**mnist1d_args(num_samples, seed)))
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)
    return {"x": d["x"].astype(np.float32), "y": d["y"].astype(np.int64),
            "x_test": d["x_test"].astype(np.float32), "y_test": d["y_test"].astype(np.int64)}


def _valid(arrays: dict[str, np.ndarray], num_samples: int) -> bool:
    n_train = int(num_samples // 10 * 10 * 0.8)  # make_dataset: samples_per_class * 10, split at 80%
    return (arrays["x"].shape == (n_train, MNIST1D_LENGTH) and arrays["y"].shape == (n_train,)
            and arrays["x_test"].shape[1:] == (MNIST1D_LENGTH,)
            and arrays["x"].shape[0] + arrays["x_test"].shape[0] == num_samples // 10 * 10)


def _read_cache(path: Path, num_samples: int) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in ("x", "y", "x_test", "y_test")}
    except (OSError, KeyError, ValueError):
        return None
    return arrays if _valid(arrays, num_samples) else None


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically (a temporary file renamed), so workers starting together never read half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp.npz")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.chmod(tmp, 0o644)  # readable by every user: a root-run scenario's cache serves later runs too
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        except (OSError, NameError):
            pass


def build_mnist1d(num_samples: int = MNIST1D_SAMPLES, seed: int = MNIST1D_SEED, *,
                  cache: bool = True) -> tuple[ArrayDataset, ArrayDataset]:
    """MNIST-1D as ``(train, test)``: ``x`` float32 ``(N, 1, 40)`` (zero mean, unit standard
    deviation over the whole set, as the package normalises it), ``y`` int64 in 0..9.

    The same ``(num_samples, seed)`` gives the same arrays on every machine with the pinned
    package version; ``cache=False`` always generates (and writes no file).
    """
    if num_samples < 10:
        raise ValueError(f"num_samples must be at least 10 (one per class), got {num_samples}")
    path = cache_path(num_samples, seed) if cache else None
    arrays = _read_cache(path, num_samples) if path is not None and path.is_file() else None
    if arrays is None:
        arrays = _generate(num_samples, seed)
        if path is not None:
            _write_cache(path, arrays)
    x, xt = arrays["x"][:, None, :], arrays["x_test"][:, None, :]
    return (ArrayDataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(arrays["y"])),
            ArrayDataset(torch.from_numpy(np.ascontiguousarray(xt)), torch.from_numpy(arrays["y_test"])))
