"""SimPy simulator of DBLP, driving the unchanged protocol core (:mod:`dblp.protocol.core`).

Quick use::

    from dblp.sim import SimConfig, simulate
    res = simulate(SimConfig(model="resnet50", rounds=200,
                             loss=[{"kind": "iteration_bursts", "at": [50, 120], "loss": 0.7}]))
    res.summary()["mean_round_s"], res.records[0]      # dblp.protocol.records.RoundRecord rows

Command line: ``python -m dblp.sim run|sweep|calibrate --help``.
"""

from dblp.sim.config import SimConfig
from dblp.sim.model import SimResult, Simulation, simulate, summarize

__all__ = ["SimConfig", "SimResult", "Simulation", "simulate", "summarize"]
