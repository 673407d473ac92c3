"""Starting runs of processes and what they are fed: the one launcher of a server and its
workers (local, namespace, Mininet and ssh hosts), the lossless loopback timer, the benchmark's
common start line, synthetic gradients of a named model's size and the gloo reference ranks.

It may import :mod:`dblp.protocol` and :mod:`dblp.transport`.
"""
