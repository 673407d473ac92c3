"""A deterministic loss for transport tests: the same datagrams are lost whatever the timing."""

from __future__ import annotations

import zlib

import numpy as np


class ScriptedLoss:
    """Drops a fixed 35% of first transmissions and 50% of second ones; later ones arrive.

    The verdict is a hash of (direction, worker, round, chunk, attempt), so
    both drivers lose exactly the same datagrams whatever their timing.
    """

    def __init__(self) -> None:
        self.attempts: dict[tuple[int, int, int, int], int] = {}

    def drops(self, direction: int, worker: int, rnd: int, seqs: np.ndarray) -> np.ndarray:
        out = np.zeros(seqs.size, bool)
        for i, s in enumerate(seqs.tolist()):
            key = (direction, worker, rnd, s)
            a = self.attempts[key] = self.attempts.get(key, 0) + 1
            h = zlib.crc32(repr((*key, a)).encode()) % 100
            out[i] = (a == 1 and h < 35) or (a == 2 and h < 50)
        return out


def lossy(udp, loss: ScriptedLoss, direction: int, worker: int, peer) -> None:
    """Make ``udp.send_chunks`` lose what the script says (the datagram never reaches the receiver)."""
    send = udp.send_chunks

    def send_chunks(headers, values, seqs, lengths, layout, addr):
        keep = ~loss.drops(direction, worker, peer.sender.round_no, seqs)
        if keep.any():
            send(headers[keep], values, seqs[keep], lengths[keep], layout, addr)

    udp.send_chunks = send_chunks
