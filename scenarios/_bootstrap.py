"""Make a scenario run in the project's environment, however it was started.

``sudo python scenarios/x.py`` runs Debian's ``/usr/bin/python`` (sudo resets
PATH), and ``python scenarios/x.py`` as root may run another interpreter; the
project's packages live in ``<repo>/.venv`` (made by ``scripts/setup.sh``).
If the running interpreter is not that one, re-exec the same command line
with it. The repository root is put on ``sys.path`` either way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"


def ensure_venv() -> None:
    in_venv = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()
    if not in_venv and VENV_PY.exists() and not os.environ.get("DBLP_NO_REEXEC"):
        os.environ["DBLP_NO_REEXEC"] = "1"  # never loop
        os.execv(str(VENV_PY), [str(VENV_PY), *sys.argv])
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


ensure_venv()
