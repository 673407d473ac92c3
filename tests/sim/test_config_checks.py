"""Bad topology parameters are refused with a message naming them, before any simulation."""

from __future__ import annotations

import pytest

from dblp.sim import SimConfig


@pytest.mark.parametrize("field,value,words", [("bandwidth_bps", 0.0, "bandwidth_bps must be a positive"),
                                               ("server_bandwidth_bps", 0.0, "server_bandwidth_bps must be a positive"),
                                               ("delay_s", -1e-6, "delay_s must be a non-negative"),
                                               ("send_pps", 0.0, "send_pps must be a positive"),
                                               ("queue_bytes", 0, "queue_bytes must be a positive")])
def test_bad_topology_is_refused_by_name(field, value, words):
    from dblp.protocol.wire import ParameterError

    with pytest.raises(ParameterError, match=words):
        SimConfig(**{field: value})
