"""The simulated network: hosts, switch ports and paths, the star / leaf-spine / two-site shapes,
the data channel's loss processes and the one adapter to SimPy's internals.

It may import :mod:`dblp.protocol` and the layers below the simulator, never an engine or a
model above it.
"""
