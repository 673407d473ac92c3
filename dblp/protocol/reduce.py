"""The server's reduce step: the mean of the workers' (partially received) gradients.

Two rules for chunks some workers did not deliver:

* ``zero`` (the paper's, Algorithm 2 l.26): missing chunks count as zeros, so
  the result is ``sum / N`` and a lost chunk shrinks that part of the mean;
* ``unbiased``: each chunk is averaged over the workers that delivered it
  (``sum / count``), and a chunk no worker delivered is zero.

The aggregation guard (:func:`guarded_mean_norm`, beyond the paper): a worker
holds the run's secret, so authentication cannot stop one whose gradient is
broken or hostile - one NaN, inf or 1e30 used to become NaN/inf/3.3e29 in
every element of every worker's mean, and a NaN at a DBLP check round
switched the run's tolerance. The rule, stated here once:

G1  Each contribution's L2 norm is summed (in double) in the same pass as the
    mean (the C helper's ``sumsq``; numpy otherwise).
G2  A contribution is *excluded* when its norm is not finite (a NaN or inf in
    it) or above ``max_norm`` (:data:`DEFAULT_MAX_NORM`, 1e18: far above any
    trainable gradient, far below float32's overflow, so the kept ones' sum
    cannot overflow).
G3  The mean is then over the kept contributions only: ``zero`` divides by
    the number kept, ``unbiased`` by each chunk's count among them - the mean
    the others would have made without that worker this round. All excluded:
    the mean is zero.
G4  Optional (``clip_norm``): a kept contribution whose norm is above it is
    scaled down to it first (norm clipping, a robust aggregation).
The driver logs and records every exclusion (:class:`Guarded`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from dblp.protocol.wire import ChunkLayout

try:  # the fused, threaded mean of the optional C helper (setup.py)
    from dblp._fastpath import mean_into as _c_mean_into
except ImportError:
    _c_mean_into = None
if os.environ.get("DBLP_NO_C"):
    _c_mean_into = None

MODES = ("zero", "unbiased")
DEFAULT_MAX_NORM = 1e18  # G2: a contribution's L2 norm above this is excluded
REDUCE_THREADS = max(1, min(4, os.cpu_count() or 1))  # the workers wait while the server reduces


def reduce_mean_norm(
    buffers: list[np.ndarray],
    masks: list[np.ndarray],
    layout: ChunkLayout,
    out: np.ndarray,
    mode: str = "zero",
) -> float:
    """Average ``buffers`` (each already zero-filled where its mask is False)
    into ``out``; returns the L2 norm of the mean (the tolerance policy's
    input). With the C helper, the ``zero`` rule is one threaded pass that
    also sums the squares; the mean is bit-identical to numpy's."""
    _check_mode(mode)
    mode = _effective(mode, masks)
    if mode == "zero" and _c_mean_into is not None:
        return math.sqrt(_c_mean_into(out, buffers, 1.0 / len(buffers), REDUCE_THREADS))
    _mean_numpy(buffers, masks, layout, out, mode)
    return math.sqrt(float(np.einsum("i,i->", out, out, dtype=np.float64)))  # in double, as the C pass


def _check_mode(mode: str) -> None:
    """Refuse a reduce rule this module does not know, naming it and the known ones."""
    if mode not in MODES:
        raise ValueError(f"reduce mode must be one of {MODES}, got {mode!r}")


def _effective(mode: str, masks: list[np.ndarray]) -> str:
    """``unbiased`` over complete contributions is ``zero`` (every count is N): the fused C pass."""
    return "zero" if mode == "unbiased" and all(m.all() for m in masks) else mode


def _mean_numpy(buffers: list[np.ndarray], masks: list[np.ndarray], layout: ChunkLayout, out: np.ndarray,
                mode: str) -> np.ndarray:
    if len(buffers) == 1:
        np.copyto(out, buffers[0])
    else:  # one pass fewer than copy-then-add
        np.add(buffers[0], buffers[1], out=out)
    for b in buffers[2:]:
        out += b
    if mode == "zero":
        out *= np.float32(1.0 / len(buffers))
        return out
    counts = np.sum(masks, axis=0).astype(np.float32)
    scale = np.divide(1.0, counts, out=np.zeros_like(counts), where=counts > 0)
    cf = layout.chunk_floats
    per_float = np.repeat(scale, cf)[: layout.elements]
    out *= per_float
    return out


@dataclass
class Guarded:
    """One round's guarded reduce: the mean's norm, each contribution's norm, and the ones left out
    (position in the buffers -> why, in words: JSON-safe for the records)."""

    norm: float
    norms: list[float]
    excluded: dict[int, str] = field(default_factory=dict)
    clipped: list[int] = field(default_factory=list)


def guarded_mean_norm(
    buffers: list[np.ndarray],
    masks: list[np.ndarray],
    layout: ChunkLayout,
    out: np.ndarray,
    mode: str = "zero",
    max_norm: float = DEFAULT_MAX_NORM,
    clip_norm: float | None = None,
) -> Guarded:
    """:func:`reduce_mean_norm` under the aggregation guard (G1-G4 above).

    The common case (nothing excluded, no clipping) costs the fused pass alone: the per-buffer
    sums of squares come from the blocks it reads anyway. A round with an exclusion or a clip
    reduces again over what is kept (numpy, or the C pass over fewer buffers)."""
    _check_mode(mode)
    if not max_norm > 0 or (clip_norm is not None and not clip_norm > 0):
        raise ValueError(f"max_norm and clip_norm must be positive, got {max_norm}, {clip_norm}")
    sumsq = np.zeros(len(buffers), np.float64)
    mode = _effective(mode, masks)
    if mode == "zero" and _c_mean_into is not None:
        norm = math.sqrt(_c_mean_into(out, buffers, 1.0 / len(buffers), REDUCE_THREADS, sumsq))
    else:
        for i, b in enumerate(buffers):
            sumsq[i] = np.einsum("i,i->", b, b, dtype=np.float64)  # in double: 1e30 squared is finite
        norm = None
    norms = np.sqrt(sumsq)
    g = Guarded(0.0, [float(x) for x in norms])
    for i, n in enumerate(norms):
        if not math.isfinite(n):
            g.excluded[i] = "norm not finite (NaN or inf in the gradient)"
        elif n > max_norm:
            g.excluded[i] = f"norm {n:.3g} above the limit {max_norm:.3g}"
    if clip_norm is not None:
        g.clipped = [i for i, n in enumerate(norms) if i not in g.excluded and n > clip_norm]
    if norm is not None and not g.excluded and not g.clipped:
        g.norm = norm
        return g
    keep = [i for i in range(len(buffers)) if i not in g.excluded]
    if not keep:
        out.fill(0.0)
        return g
    kept = [buffers[i] for i in keep]
    if g.clipped:  # G4: scaled copies, never the receive buffers (a host-local slot is the worker's)
        kept = [b * np.float32(clip_norm / norms[i]) if i in g.clipped else b for i, b in zip(keep, kept)]
    g.norm = reduce_mean_norm(kept, [masks[i] for i in keep], layout, out, mode)
    return g
