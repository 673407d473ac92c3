"""The simulator models either data wire: the paper's (362 floats a datagram) or the authenticated one (358)."""

import pytest

from dblp.sim import SimConfig, simulate
from dblp.protocol.wire import ParameterError


def test_wire_sets_the_chunking_and_is_checked():
    assert SimConfig(model=1_000_000).layout.chunk_floats == 362
    lay = SimConfig(model=1_000_000, wire=2).layout
    assert (lay.chunk_floats, lay.chunks, lay.datagram_size) == (358, 2794, 1472)
    with pytest.raises(ParameterError, match="wire must be 1"):
        SimConfig(wire=3)


@pytest.mark.parametrize("fidelity", ["round", "packet"])
def test_authenticated_wire_records_its_chunks(fidelity):
    res = simulate(SimConfig(model=200_000, workers=2, rounds=3, wire=2, fidelity=fidelity, policy="reliable"))
    assert {r.chunks for r in res.records} == {-(-200_000 // 358)}
    assert all(r.up_received == r.chunks for r in res.records if r.role == "server")
