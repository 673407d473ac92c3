"""The round level's small tools (:mod:`dblp.sim.engines.fast`, :mod:`dblp.sim.engines.roundflow`): the random stream of a
pass's draws, two process-wide memory settings, counts over sorted arrays, shared empty arrays.

* :func:`_rng` / :func:`_uniforms`: the stream named by a pass's entropy words, the very doubles of
  ``np.random.default_rng(entropy).random(n)`` (seeded in C by the optional helper when it is built);
* :func:`keep_heap` and :func:`quiet_gc`: malloc keeps freed pages, the cyclic collector runs less
  often (neither changes a result);
* :func:`_count_le` and :func:`_slots_below`: ``searchsorted`` without the search in the common cases.
"""

from __future__ import annotations

import gc
import os

import numpy as np

try:  # a pass's arrivals in one C loop (the optional helper, setup.py); numpy in port_refresh otherwise
    from dblp._fastpath import fluid_arrivals as _c_fluid_arrivals
except ImportError:
    _c_fluid_arrivals = None
try:  # a pass's stream of draws seeded in C (_uniforms); numpy's SeedSequence otherwise
    from dblp._fastpath import pcg64_seed as _c_pcg64_seed
except ImportError:
    _c_pcg64_seed = None
if os.environ.get("DBLP_NO_C"):
    _c_fluid_arrivals = _c_pcg64_seed = None

_HEAP_KEPT = False
_EMPTY_I = np.empty(0, np.int64)
_EMPTY_F = np.empty(0)
_GC_GEN0 = 100_000  # see quiet_gc


def _rng(entropy: list[int]) -> np.random.Generator:
    """``np.random.default_rng(entropy)``'s very generator (the same stream), built without its
    argument dispatch: half the cost, and the round level builds one per pass and port.

    Entropy words below 2**32 go in as one uint32 array: SeedSequence coerces a list to exactly
    that (one word per such int), one int at a time (two thirds of its cost)."""
    if max(entropy) < 1 << 32 and min(entropy) >= 0:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(np.array(entropy, np.uint32))))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


_UNI_BG: np.random.PCG64 | None = None  # _uniforms' bit generator, its state set per stream
_UNI_GEN: np.random.Generator | None = None


def _uniforms(entropy: list[int], n: int) -> np.ndarray:
    """``_rng(entropy).random(n)``: the same doubles, the stream's PCG64 state computed in C
    (``pcg64_seed``: SeedSequence's hash and PCG's seeding) and set on one kept generator.
    Why: building the SeedSequence and the PCG64 cost ~25 us, as much as the draws, and the
    round level draws once per pass and port (~1,400 times an iteration at 1024 paced workers)."""
    global _UNI_BG, _UNI_GEN
    if _c_pcg64_seed is None or max(entropy) >= 1 << 32 or min(entropy) < 0:
        return _rng(entropy).random(n)
    sh, sl, ih, il = _c_pcg64_seed(np.array(entropy, np.uint32))
    if _UNI_BG is None:
        _UNI_BG = np.random.PCG64(0)
        _UNI_GEN = np.random.Generator(_UNI_BG)
    _UNI_BG.state = {"bit_generator": "PCG64", "state": {"state": (sh << 64) | sl, "inc": (ih << 64) | il},
                     "has_uint32": 0, "uinteger": 0}
    return _UNI_GEN.random(n)


def keep_heap() -> None:
    """Ask glibc's malloc to keep freed memory instead of returning it to the kernel.

    Why: every pass allocates arrays of its slots (leave times, draws, arrivals),
    and with many workers they add up to hundreds of MB that are freed and
    allocated again each round. By default malloc gives the top of the heap back
    (``brk``) and the next round faults every page in again: at 1024 workers
    that was up to a quarter of the run's CPU time as system time, the more
    the busier the machine. Raising the trim and mmap thresholds keeps those pages for reuse.
    Process-wide, done once; a no-op where there is no glibc.
    """
    global _HEAP_KEPT
    if _HEAP_KEPT:
        return
    _HEAP_KEPT = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: trim only above 1 GiB of free top
        libc.mallopt(-3, 1 << 25)  # M_MMAP_THRESHOLD: arrays below 32 MiB come from the (reused) heap
    except (OSError, AttributeError):
        pass


def quiet_gc() -> None:
    """Let Python's cyclic collector run its youngest generation every ``_GC_GEN0``
    allocations instead of 700 (process-wide, never lowered).

    Why: the round level allocates a few hundred short-lived container objects
    per worker and round (queue entries, bound methods, the core's batches),
    so the collector ran every few flows, each time also walking what the run
    keeps (records, sessions): ~8-10% of a 512-1024-worker run. A larger
    threshold collects the same garbage, in fewer passes. Never changes a result.
    At 10,000 a paced 1024-worker run still collected 68 times in 30 iterations
    (1.4 s of its 22 s in the collector, ``gc.callbacks``; a round level run leaves
    next to no cyclic garbage: 9 objects at 256 x 20); at 100,000, 3 times (0.26 s).
    """
    g0, g1, g2 = gc.get_threshold()
    if 0 < g0 < _GC_GEN0:
        gc.set_threshold(_GC_GEN0, g1, g2)


def _count_le(a: np.ndarray, x: float, limit: int) -> int:
    """``min(a.searchsorted(x, side="right"), limit)`` for a sorted ``a`` with at least ``limit``
    entries: the common ends (none or all of the first ``limit``) without a binary search."""
    if limit <= 0 or x < a[0]:
        return 0
    if x >= a[limit - 1]:
        return limit
    return min(int(a.searchsorted(x, side="right")), limit)


def _slots_below(d_slot: np.ndarray, b: int) -> int:
    """How many of the increasing slots ``d_slot`` are below ``b``: ``d_slot.searchsorted(b)``,
    without the search when the slots are every one of 0..n-1 (the common case)."""
    nd = d_slot.size
    if nd == 0 or int(d_slot[-1]) == nd - 1:
        return min(b, nd)
    return int(d_slot.searchsorted(b, side="left"))
