"""One progress format with an ETA for every long run (dblp.cli.progress)."""

from __future__ import annotations

from dblp.cli.progress import Progress, Stamped, clock_text, eta_text


def test_eta_text_and_clock_text():
    assert eta_text(400, 1000, 32.5) == "40 %, 12.3 it/s, elapsed 32 s, ETA 49 s"
    assert eta_text(1, 10, 300, "run") == "10 %, 300 s/run, elapsed 5 min 00 s, ETA 45 min 00 s"
    assert eta_text(0, 10, 3) == "0 %, elapsed 3 s"
    assert clock_text(7500) == "2 h 05 min"


def test_progress_prints_when_due_and_at_the_end():
    t = [100.0]
    lines: list[str] = []
    p = Progress(50, "dblp", every_s=5.0, out=lines.append, clock=lambda: t[0])
    t[0] = 102.0
    assert not p.update(0)  # the first iteration starts: the clock restarts, start-up left out
    t[0] = 112.0
    assert p.update(10) and lines[-1] == "  dblp      iteration 10/50  (20 %, 1 it/s, elapsed 10 s, ETA 40 s)"
    t[0] = 113.0
    assert not p.update(11)  # not due yet
    assert p.update(12, force=True)
    t[0] = 150.0
    assert p.update(50) and "ETA 0 s" in lines[-1] and len(lines) == 3


def test_stamped_lines_count_seconds_from_their_start_and_keep_quiet(capsys):
    t = [10.0]
    say = Stamped(clock=lambda: t[0])
    t[0] = 22.34
    say("hosts up")
    Stamped(quiet=True)("never printed")
    assert capsys.readouterr().out == "[   12.3s] hosts up\n"
