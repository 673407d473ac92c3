#!/usr/bin/env python3
"""Sweep DBLP against the baseline in the simulator over a parameter grid.

Same options as ``python -m dblp.sim sweep`` (see ``--help``), e.g.::

    python scenarios/sweep.py --p-high 0.1,0.2,0.4,0.6 --eta 0.3,0.5,0.7 \
        --burst-rate 0.005,0.01,0.02 --iterations 300 --out results/sweep

Writes ``sweep.csv``, ``sweep.json`` and ``heatmap_*.png`` into ``--out``.
"""

import sys

import _bootstrap  # noqa: E402,F401  (re-exec into the project's .venv; repo root on sys.path)

from dblp.sim.studies.sweep import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
