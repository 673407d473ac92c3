"""How many event loops a server runs by default (dblp.transport.server.loop_threads) and the loops' threads kept."""

from __future__ import annotations

import pytest

from dblp.transport.server import ServerConfig, loop_threads
from dblp.transport.sockets import _loop_pool
from dblp.protocol.wire import ParameterError


@pytest.mark.parametrize("workers,cores,want", [(3, 2, 2), (1, 2, 1), (3, 16, 3), (8, 16, 8), (8, 4, 2), (100, 256, 64)])
def test_one_loop_per_worker_up_to_half_the_cores(workers, cores, want):
    assert loop_threads(workers, cores) == want


def test_threads_zero_is_resolved_and_bad_counts_are_refused_by_name():
    assert ServerConfig(workers=3, threads=0).threads == loop_threads(3)
    assert ServerConfig(workers=3, threads=5).threads == 5
    for bad in (-1, 65):
        with pytest.raises(ParameterError, match=f"threads must be in \\[0, 64\\].*got {bad}"):
            ServerConfig(workers=3, threads=bad)
    assert _loop_pool() is _loop_pool()  # one pool of helper loops per process, kept
