"""traces.units: one parser per quantity, one meaning per suffix, clear errors naming the flag."""

from __future__ import annotations

import argparse

import pytest

from traces.units import (
    FRAME_BYTES,
    HelpFormatter,
    UnitError,
    duration_arg,
    fmt_duration,
    fmt_rate,
    fmt_size,
    parse_duration,
    parse_queue,
    parse_rate,
    parse_size,
    rate_arg,
    size_arg,
)


@pytest.mark.parametrize("text, bps", [
    ("500M", 500e6), ("500m", 500e6), ("10G", 10e9), ("1.5k", 1500.0),          # a bare prefix: bits
    ("500mbit", 500e6), ("500Mbit/s", 500e6), ("1gbit", 1e9), ("2bits", 2.0),   # bits
    ("1kibit", 1024.0), ("1Mi", 1024.0**2),                                     # IEC prefixes
    ("2.5e9", 2.5e9), ("0", 0.0),                                               # bare: default unit bit
])
def test_rate_suffixes_have_one_meaning(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text, bps", [("125mbps", 1e9), ("1Gbps", 8e9), ("1bps", 8.0), ("1mibps", 8 * 1024.0**2)])
def test_tc_text_reads_bps_as_bytes(text, bps):
    assert parse_rate(text, tc=True) == pytest.approx(bps)  # tc: bps = BYTES per second


def test_mbps_on_a_command_line_is_refused_naming_both_readings():
    """``--bandwidth 500Mbps`` was 4 Gbit/s (tc's bytes), silently; now it says both and what to write."""
    with pytest.raises(UnitError) as exc:
        parse_rate("500Mbps", "Mbit")
    assert str(exc.value) == ("rate '500Mbps' is ambiguous: 'mbps' is bits per second to most tools (500 Mbit/s) "
                              "but bytes per second to tc (4 Gbit/s); write 500mbit for 500 Mbit/s")
    with pytest.raises(argparse.ArgumentTypeError, match="ambiguous"):
        rate_arg()("10Gbps")


def test_a_bare_rate_is_in_the_flags_unit():
    assert parse_rate("500", "Mbit") == 500e6  # `dblp.sim run --bandwidth 500` is 500 Mbit/s, not 500 bit/s
    assert parse_rate("500M", "Mbit") == 500e6  # a unit given wins
    assert parse_rate(1e9, "Mbit") == 1e9 * 1e6  # numbers are in the default unit too


@pytest.mark.parametrize("bad", ["", "fast", "5q", "-1", "1e", "M", "5 ms", "nan"])
def test_bad_rates_are_refused(bad):
    with pytest.raises(UnitError):
        parse_rate(bad)
    with pytest.raises(UnitError):
        parse_rate("0", allow_zero=False)


def test_sizes_are_si_with_iec_on_request():
    assert parse_size("25M") == 25_000_000 and parse_size("5e6") == 5_000_000 and parse_size("200k") == 200_000
    assert parse_size("1MiB") == 1 << 20 and parse_size("64KiB") == 65536 and parse_size("150kB") == 150_000
    assert parse_size("1000") == 1000 and parse_size(12) == 12
    for bad in ("lots", "1bit", "0", "-5", "1.5Q", "1.5", "0.5k1"):
        with pytest.raises(UnitError):
            parse_size(bad)


def test_queues_are_bytes_or_full_frames():
    assert parse_queue("100pkt") == 100 * FRAME_BYTES == 151_400
    assert parse_queue("1MiB") == 1 << 20 and parse_queue("150000") == 150_000
    with pytest.raises(UnitError):
        parse_queue("0pkt")


def test_durations():
    assert parse_duration("50us") == pytest.approx(50e-6) and parse_duration("5ms") == pytest.approx(5e-3)
    assert parse_duration("0.2") == 0.2 and parse_duration("2min") == 120 and parse_duration("1h") == 3600
    assert parse_duration("5", "ms") == pytest.approx(0.005) and parse_duration("300ns") == pytest.approx(3e-7)
    for bad in ("5m", "soon", "-1s"):  # "m" would be minutes or milli: neither
        with pytest.raises(UnitError):
            parse_duration(bad)


def test_formatters_round_trip():
    assert fmt_rate(5e8) == "500 Mbit/s" and fmt_rate(1e10) == "10 Gbit/s" and fmt_rate(0) == "unlimited"
    assert fmt_duration(0.05) == "50 ms" and fmt_duration(5e-5) == "50 us"
    for n in (25_000_000, 200_000, 1_500_000, 1234):
        assert parse_size(fmt_size(n)) == n
    assert fmt_size(200_000) == "200K"


def test_argparse_types_name_the_flag_and_show_defaults(capsys):
    ap = argparse.ArgumentParser(prog="x", formatter_class=HelpFormatter)
    ap.add_argument("--bandwidth", type=rate_arg(), default="500M", help="link rate; a bare number is Mbit/s")
    ap.add_argument("--compute", type=duration_arg(), default="5ms", help="compute time")
    ap.add_argument("--model", type=size_arg(), default="1e6", help="elements")
    ap.add_argument("--flag", action="store_true", help="a switch")
    a = ap.parse_args(["--bandwidth", "300"])
    assert a.bandwidth == 300e6 and a.compute == pytest.approx(0.005) and a.model == 1_000_000
    with pytest.raises(SystemExit):
        ap.parse_args(["--bandwidth", "fast"])
    err = capsys.readouterr().err
    assert "argument --bandwidth" in err and "'fast'" in err and "Traceback" not in err
    text = ap.format_help()
    assert "(default: 500M)" in text and "(default: 5ms)" in text and "(default: False)" not in text
