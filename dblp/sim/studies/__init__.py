"""Studies built on the simulator: calibration from a results folder, parameter sweeps with their
runners and replicates, the paper-scale predictions, the emulation-against-simulator cross-check and
the per-mode comparison of measured and predicted time to accuracy.

It may import every other part of the simulator and the packages below it; only
:mod:`dblp.sim.cli` imports it.
"""
