"""Every scenario starts as the README says, ``sudo python scenarios/X.py``, from any interpreter.

sudo resets PATH, so the scenario runs under the system's Python, which has
none of the project's packages: each must re-exec itself into ``.venv``
(``scenarios/_bootstrap.py``) before it imports anything else.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PY = Path("/usr/bin/python3")
SCENARIOS = sorted(p for p in (ROOT / "scenarios").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.skipif(not SYSTEM_PY.exists() or not (ROOT / ".venv" / "bin" / "python").exists(),
                    reason="needs the system python3 and the project's .venv")
@pytest.mark.parametrize("script", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_starts_under_the_system_python(script):
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", "/root")}  # as sudo leaves it
    out = subprocess.run([str(SYSTEM_PY), str(script), "--help"], env=env, cwd="/", capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout
