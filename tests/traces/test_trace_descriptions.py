"""netem and mahimahi descriptions: what maps to a loss trace, and what is refused."""

from __future__ import annotations

import numpy as np
import pytest

from traces import NotMappableError, TraceError, read_trace, write_trace
from traces.import_desc import parse_mahimahi, parse_netem, parse_percent, parse_rate


def test_netem_random_loss():
    m = parse_netem("loss random 1%")
    assert (m.kind, m.params) == ("bernoulli", {"loss": 0.01})
    assert parse_netem("loss 2").params == {"loss": 0.02}  # iproute2: a bare number is a percentage
    assert parse_netem("loss 0.5% 0%").params == {"loss": 0.005}


def test_netem_gemodel_defaults_follow_iproute2():
    m = parse_netem("loss gemodel 1%")
    assert m.kind == "gilbert-elliott"
    assert m.params == pytest.approx({"p": 0.01, "r": 0.99, "bad_loss": 1.0, "good_loss": 0.0})
    m = parse_netem("loss gemodel 1% 10% 70% 0.1%")
    assert m.params == pytest.approx({"p": 0.01, "r": 0.1, "bad_loss": 0.7, "good_loss": 0.001})


def test_netem_full_tc_line():
    m = parse_netem("tc qdisc add dev s1-eth1 root handle 1: netem delay 10ms 2ms distribution normal loss gemodel 2% 25% rate 1gbit limit 100")
    assert m.kind == "gilbert-elliott"
    assert m.rate_bps == 1e9 and m.queue_pkts == 100
    assert m.ignored == ["delay 10ms 2ms", "distribution normal"]
    tr = m.segments(100_000, packet_interval_us=12.0, seed=1)
    assert np.all(tr.rate_bps == 1e9) and np.all(tr.queue_pkts == 100)
    assert tr.meta.provenance == "generated"
    assert tr.meta.extra["ignored"] == m.ignored


def test_netem_corrupt_is_extra_loss():
    assert parse_netem("loss 10% corrupt 10%").params["loss"] == pytest.approx(0.19)
    ge = parse_netem("loss gemodel 1% 20% 50% 0% corrupt 1%").params
    assert ge["bad_loss"] == pytest.approx(0.505) and ge["good_loss"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    "desc",
    ["loss 1% 25%", "loss state 1% 2%", "delay 1ms slot 800us 1ms", "loss 1% frobnicate 3"],
)
def test_netem_not_mappable(desc):
    with pytest.raises(NotMappableError):
        parse_netem(desc)


def test_netem_bad_values():
    with pytest.raises(TraceError):
        parse_netem("loss 150%")
    with pytest.raises(TraceError):
        parse_netem("rate fast")


def test_netem_samples_match_model(tmp_path):
    m = parse_netem("loss gemodel 1% 25%")
    tr = m.packets(400_000, seed=3)
    assert tr.mean_loss() == pytest.approx(m.mean_loss(), rel=0.1)
    back = read_trace(write_trace(tr, tmp_path / "n.pkts"))
    assert back.meta.source.startswith("netem: loss gemodel")


def test_units():
    assert parse_percent("12.5%") == 0.125
    assert parse_rate("100mbit") == 1e8
    assert parse_rate("1.5Gbit") == 1.5e9
    assert parse_rate("125mbps") == 1e9  # tc: bps are bytes per second
    assert parse_rate("1000") == 1000.0


def test_mahimahi_loss_per_direction_and_nesting():
    cmd = "mm-delay 10 mm-loss uplink 0.1 mm-loss downlink 0.2 mm-loss uplink 0.1 -- ./client"
    up = parse_mahimahi(cmd, "uplink")
    assert up.kind == "bernoulli" and up.params["loss"] == pytest.approx(0.19)
    assert up.ignored == ["mm-delay 10"]
    assert parse_mahimahi(cmd, "downlink").params["loss"] == pytest.approx(0.2)
    assert parse_mahimahi("mm-delay 5", "uplink").kind == "none"


def test_mahimahi_onoff_maps_to_bursts():
    m = parse_mahimahi("mm-onoff uplink 0.05 0.005 mm-loss uplink 0.01")
    assert m.kind == "onoff"
    assert m.params == {"on_mean_us": 5000.0, "off_mean_us": 50000.0, "on_loss": 1.0, "off_loss": 0.01, "dist": "exponential"}
    tr = m.segments(60_000_000, seed=2)
    assert tr.mean_loss() == pytest.approx(m.mean_loss(), rel=0.1)


def test_mahimahi_errors():
    with pytest.raises(TraceError):
        parse_mahimahi("mm-loss uplink 1.5")
    with pytest.raises(NotMappableError):
        parse_mahimahi("mm-loss sideways 0.1")
    with pytest.raises(TraceError):
        parse_mahimahi("mm-loss uplink 0.1", direction="both")
