"""CLI smoke tests: generate + show (summary and PNG), imports, --help everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from traces import read_trace
from traces.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_module_generate_and_show(tmp_path):
    """The real entry point, as a user runs it: python -m traces ..."""
    out = tmp_path / "b.loss.csv"
    png = tmp_path / "b.png"
    env_py = [sys.executable, "-m", "traces"]
    r = subprocess.run(
        env_py + ["generate", "onoff", "--duration", "5s", "--seed", "3", "-o", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(env_py + ["show", str(out), "--png", str(png)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "mean loss:" in r.stdout and "bursts:" in r.stdout and "burst length [µs]" in r.stdout
    assert png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args,form",
    [
        (["generate", "bernoulli", "--loss", "5%", "--packets", "20000"], "packets"),
        (["generate", "bernoulli", "--loss", "0.05", "--duration", "1ms"], "segments"),
        (["generate", "ge", "--good-to-bad", "1%", "--bad-to-good", "20%", "--packets", "5000"], "packets"),
        (["generate", "gilbert-elliott", "--good-to-bad", "1%", "--duration", "100ms", "--packet-interval", "1.2us"], "segments"),
        (["generate", "onoff", "--duration", "1s", "--dist", "pareto", "--alpha", "2"], "segments"),
        (["generate", "iteration-burst", "--iteration-period", "1ms", "--bursts", "3,7", "--iterations", "10"], "segments"),
        (["generate", "iteration-burst", "--iteration-period", "1ms", "--count", "2", "--iterations", "50"], "segments"),
        (["import-netem", "loss gemodel 1% 25%", "--packets", "3000"], "packets"),
        (["import-mahimahi", "mm-loss downlink 0.02", "--direction", "downlink", "--duration", "5ms"], "segments"),
    ],
)
def test_generate_and_show_in_process(tmp_path, capsys, args, form):
    out = tmp_path / ("t.pkts" if form == "packets" else "t.loss.csv")
    assert main(args + ["--seed", "1", "-o", str(out)]) == 0
    tr = read_trace(out)
    assert tr.meta.form == form and tr.meta.provenance == "generated" and tr.meta.seed == 1
    capsys.readouterr()
    assert main(["show", str(out), "--png", str(tmp_path / "p.png")]) == 0
    text = capsys.readouterr().out
    assert f"mean loss:   {tr.mean_loss():.6f}" in text
    assert (tmp_path / "p.png").exists()


def test_show_json_and_default_png(tmp_path, capsys):
    out = tmp_path / "x.loss.csv"
    main(["generate", "iteration-burst", "--iteration-period", "1ms", "--bursts", "2", "--iterations", "5", "-o", str(out)])
    capsys.readouterr()
    assert main(["show", str(out), "--json"]) == 0
    import json

    s = json.loads(capsys.readouterr().out)
    assert s["bursts"] == 1 and s["burst_mean"] == 1000 and abs(s["mean_loss"] - 0.14) < 1e-12
    assert (tmp_path / "x.loss.png").exists()


def test_show_refuses_malformed_trace(tmp_path, capsys):
    bad = tmp_path / "bad.loss.csv"
    main(["generate", "bernoulli", "--loss", "0.1", "--duration", "100us", "-o", str(bad)])
    bad.write_text(bad.read_text().replace("0,0.1", "0,1.1"))
    capsys.readouterr()
    assert main(["show", str(bad), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "outside [0, 1]" in err


def test_resample_and_loop(tmp_path, capsys):
    src = tmp_path / "o.loss.csv"
    main(["generate", "onoff", "--duration", "2s", "--seed", "2", "--loop", "-o", str(src)])
    dst = tmp_path / "r.loss.csv"
    assert main(["resample", str(src), "--bin", "1ms", "-o", str(dst)]) == 0
    a, b = read_trace(src), read_trace(dst)
    assert a.loop and b.loop
    assert b.mean_loss() == pytest.approx(a.mean_loss(), rel=1e-9)


def test_import_commands(tmp_path, capsys):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    from scapy.utils import wrpcap

    from dblp.results.traceimport import main as dblp_import
    from dblp.protocol.wire import ChunkLayout, encode_chunks

    layout = ChunkLayout(elements=362 * 30)
    rows, lengths = encode_chunks(np.ones(layout.elements, np.float32), layout, np.arange(layout.chunks), run_id=7, sender=0, round_no=1)
    pk = [Ether() / IP() / UDP(dport=9000) / Raw(bytes(rows[i, : lengths[i]])) for i in range(layout.chunks)]
    for i, p in enumerate(pk):
        p.time = 100 + i * 1e-5
    drop = {2, 3, 4, 17}
    wrpcap(str(tmp_path / "s.pcap"), pk)
    wrpcap(str(tmp_path / "r.pcap"), [p for i, p in enumerate(pk) if i not in drop])
    out = tmp_path / "d.pkts"
    assert dblp_import(["--sent", str(tmp_path / "s.pcap"), "--received", str(tmp_path / "r.pcap"), "-o", str(out)]) == 0
    assert set(np.flatnonzero(read_trace(out).drops)) == drop
    out2 = tmp_path / "d.loss.csv"
    assert dblp_import(["--received", str(tmp_path / "r.pcap"), "--expected-chunks", "30", "-o", str(out2), "--bin", "50us"]) == 2
    assert dblp_import(["--received", str(tmp_path / "r.pcap"), "--expected-chunks", "30", "-o", str(out)]) == 0
    assert set(np.flatnonzero(read_trace(out).drops)) == drop
    assert main(["import-tcp", str(tmp_path / "s.pcap"), "-o", str(out)]) == 2  # no TCP in there: clean error
    assert "no TCP data segments" in capsys.readouterr().err
    # the DBLP import lives in dblp (it needs the wire format); the old name says where it went
    assert main(["import-dblp", "--received", str(tmp_path / "r.pcap"), "-o", str(out)]) == 2
    assert "python -m dblp.results.traceimport" in capsys.readouterr().err


def _subcommands(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {n}", s) for n, s in _subcommands(sub))


def test_every_command_has_help(capsys):
    names = [n for n, _ in _subcommands(build_parser())]
    assert {"generate", "show", "generate onoff", "generate iteration-burst", "import-tcp"} <= set(names)
    for name in [""] + names:
        with pytest.raises(SystemExit) as ei:
            main([*name.split(), "--help"])
        assert ei.value.code == 0
        assert "usage:" in capsys.readouterr().out
    from dblp.results.traceimport import main as dblp_import

    with pytest.raises(SystemExit) as ei:
        dblp_import(["--help"])
    assert ei.value.code == 0 and "--expected-chunks" in capsys.readouterr().out
