"""The nft module's text and its script runners (emulation.nft), without a kernel: set elements of a
packet trace and its counter's modulus, the rate a rule applies, the table's removal, the backend
choice, and the names the replayer still re-exports."""

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


def test_a_packet_traces_counter_wraps_at_its_length_only_when_it_loops():
    drops = np.array([True, False, False, True, True])
    looped = nft.trace_drop_lines("t", "c", "meta l4proto udp", drops, loop=True)
    assert 'add rule netdev t c meta l4proto udp numgen inc mod 5 @drops_c counter name "drop_c" drop' in looped
    assert "add element netdev t drops_c { 0, 3-4 }" in looped
    once = nft.trace_drop_lines("t", "c", "meta l4proto udp", drops, loop=False)
    assert f"numgen inc mod {nft.INC_MOD_ONCE} @drops_c" in once[-1] and nft.INC_MOD_ONCE == 4_294_967_295
    # no drops: the packets are counted and none is dropped (no drop rule at all)
    none = nft.trace_drop_lines("t", "c", "meta l4proto udp", np.zeros(4, bool), loop=True)
    assert none[-1] == 'add rule netdev t c meta l4proto udp counter name "seen_c"'


def test_the_rate_a_rule_applies_and_the_table_removal():
    assert nft.applied_rate(0.1234567, nft.FINE_MOD) == 0.123457
    assert nft.applied_rate(0.00004, nft.MOD) == 0.0 and nft.applied_rate(0.00006, nft.MOD) == 0.0001  # 0.01% steps
    assert nft.applied_rate(1 + 1e-12, nft.FINE_MOD) == 1.0  # an averaged level a hair above 1 is total loss
    assert nft.threshold(nft.applied_rate(0.25, nft.FINE_MOD), nft.FINE_MOD) == 250_000
    assert nft.script(nft.delete_table_lines("dblp_loss_replay7_1")) == "delete table netdev dblp_loss_replay7_1\n"
    assert nft.delete_table_args("x", "inet") == ["nft", "delete", "table", "inet", "x"]
