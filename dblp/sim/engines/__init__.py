"""The simulator's round engines: packet level (every datagram an event), round level (numpy
over each retransmission pass: flows, host scheduling, incast, host-local transfers) and the
class-level fabric for 10,000 workers. Each drives the unchanged protocol core.

It may import :mod:`dblp.sim.network` and the packages below the simulator.
"""
