"""The nft module's text and its script runners (emulation.nft), without a kernel: set elements of a
packet trace, the backend choice, and the names the replayer still re-exports."""

from __future__ import annotations

import numpy as np
import pytest

from emulation import nft, replay


def test_interval_elements_write_runs_of_drops_as_ranges():
    drops = np.array([False, True, True, False, True, False, True, True, True])
    assert nft.interval_elements(drops) == ["1-2", "4", "6-8"]
    assert nft.interval_elements(np.zeros(5, bool)) == []
    lines = nft.packet_drop_lines("t", "c", "meta l4proto udp", nft.interval_elements(drops), 9)
    assert "add element netdev t drops_c { 1-2, 4, 6-8 }" in lines


def test_make_backend_by_name_and_the_replayers_names():
    assert isinstance(nft.make_backend("nft"), nft.CliNftBackend)
    with pytest.raises(ValueError, match="unknown backend"):
        nft.make_backend("iptables")
    assert replay.LibNftBackend is nft.LibNftBackend and replay.have_libnftables is nft.have_libnftables
