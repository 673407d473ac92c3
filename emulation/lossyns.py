"""A network namespace whose loopback drops a fraction of UDP datagrams.

The smallest lossy network there is: processes started with :meth:`prefix`
talk over the namespace's ``lo``, and an nftables rule in the input hook
drops ``loss`` of the UDP datagrams at random (``numgen random``), TCP
untouched. Used by the transport tests and by ``scenarios/train.py`` where
Mininet would be overkill. The namespace (and with it the rule) is deleted
on exit; ``python -m emulation.cleanup --all-dblp`` removes one a killed run
left behind.
"""

from __future__ import annotations

import os
import subprocess
import uuid

from . import nft

TABLE = "dblp_lossy"


class LossyLoopback:
    def __init__(self, loss: float, prefix: str = "dblp-lossy") -> None:
        self.threshold = nft.threshold(loss)
        self.loss = loss
        self.name = f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"  # the creator's pid, as every testbed name

    def __enter__(self) -> "LossyLoopback":
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        try:
            self.run(["ip", "link", "set", "lo", "up"])
            rules = nft.script(nft.chain_lines(TABLE, "in", "input", family="inet", priority=0)
                               + nft.drop_lines(TABLE, "in", nft.match("udp"), self.loss, family="inet"))
            subprocess.run(self.prefix() + ["nft", "-f", "-"], input=rules, text=True, check=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def prefix(self) -> list[str]:
        """Command prefix that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def run(self, args: list[str]) -> str:
        return subprocess.run(self.prefix() + args, check=True, capture_output=True, text=True).stdout

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
