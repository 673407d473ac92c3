"""The protocol, sans I/O: wire format, control messages, the per-transfer rules (R1-R10 in
:mod:`dblp.protocol.core`), pacing (R11-R17 in :mod:`dblp.protocol.pacing`), policies, loss
compensation, the reduce step and the round sessions of server and worker (S1-S8 in
:mod:`dblp.protocol.session`), with the per-round records they emit.

Nothing here opens a socket, reads a clock of its own or starts a process: every driver (the
socket transport, the simulator, the training exchange) feeds it events and carries out what it
returns. It imports only the standard library, numpy, the C helper (:mod:`dblp._fastpath`) and
:mod:`traces`.
"""
