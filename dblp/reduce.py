"""The server's reduce step: the mean of the workers' (partially received) gradients.

Two rules for chunks some workers did not deliver:

* ``zero`` (the paper's, Algorithm 2 l.26): missing chunks count as zeros, so
  the result is ``sum / N`` and a lost chunk shrinks that part of the mean;
* ``unbiased``: each chunk is averaged over the workers that delivered it
  (``sum / count``), and a chunk no worker delivered is zero.
"""

from __future__ import annotations

import math
import os

import numpy as np

from .wire import ChunkLayout

try:  # the fused, threaded mean of the optional C helper (setup.py)
    from ._fastpath import mean_into as _c_mean_into
except ImportError:
    _c_mean_into = None
if os.environ.get("DBLP_NO_C"):
    _c_mean_into = None

MODES = ("zero", "unbiased")
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
    if mode not in MODES:
        raise ValueError(f"reduce mode must be one of {MODES}, got {mode!r}")
    if mode == "zero" and _c_mean_into is not None:
        return math.sqrt(_c_mean_into(out, buffers, 1.0 / len(buffers), REDUCE_THREADS))
    _mean_numpy(buffers, masks, layout, out, mode)
    return float(np.linalg.norm(out))


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
