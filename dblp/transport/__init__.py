"""The socket transport: the UDP data socket, the TCP control channel, the parameter server's
login and rounds, the worker, the sharded servers, the host-local shared-memory path and the round
watcher (the server's round hook and its follower).

It drives :mod:`dblp.protocol` with real sockets and may import it, never a package above
(runs, cli, results, train, sim).
"""
