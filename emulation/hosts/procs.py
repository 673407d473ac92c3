"""One program on one host, watched: its output streamed to a local log, its remote pid file, its end.

Why pid files: with ssh, ending the local client does not end the remote
program; ``exec`` in :func:`~emulation.hosts.commands.host_script` keeps the
shell's pid, so ``<rdir>/<tag>.pid`` names the program itself and
:meth:`HostProc.stop` can end it on the host.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
from pathlib import Path

from dblp.transport.watch import end_process_group
from .commands import host_script, redact
from .inventory import HostSpec
from .transport import Transport


class HostProc:
    """One program on one host: the local client process, its log, and its remote pid file."""

    def __init__(self, tr: Transport, host: HostSpec, tag: str, rdir: str, argv: list[str], log: Path,
                 watch: str | None = None, secret: str | None = None) -> None:
        self.tr, self.host, self.tag, self.rdir = tr, host, tag, rdir
        self.log_path = log
        self.script = host_script(host, rdir, tag, argv, secret)
        self.pattern = re.compile(watch) if watch else None
        self.match: re.Match | None = None
        self.matched = threading.Event()
        self.tail: list[str] = []
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "w", encoding="utf-8")
        self._log.write(f"# {host.name}: {redact(shlex.join(tr.argv(host, self.script)), secret)}\n")
        self._log.flush()
        self.proc = tr.start(host, self.script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        self._pump = threading.Thread(target=self._read, name=f"log-{host.name}-{tag}", daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            self._log.write(line)
            self._log.flush()
            self.tail = (self.tail + [line])[-40:]
            if self.pattern and not self.matched.is_set():
                m = self.pattern.search(line)
                if m:
                    self.match = m
                    self.matched.set()
        self.matched.set()  # EOF: nobody waits forever

    def poll(self) -> int | None:
        return self.proc.poll()

    def last_lines(self, n: int = 15) -> str:
        return "".join(self.tail[-n:])

    def stop(self, grace: float = 3.0) -> None:
        """End the program: the local client, then the remote pid (ssh leaves it running otherwise)."""
        end_process_group(self.proc, grace)
        pidf = shlex.quote(f"{self.rdir}/{self.tag}.pid")
        kill = (f"if [ -f {pidf} ]; then p=$(cat {pidf}); if kill -0 $p 2>/dev/null; then kill -TERM $p; "
                f"for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 $p 2>/dev/null || exit 0; sleep 0.3; done; "
                f"kill -KILL $p; fi; fi")
        try:
            self.tr.run(self.host, kill, timeout=20)
        except Exception:  # noqa: BLE001 - best effort; netns closes its namespaces anyway
            pass
        self.close_log()

    def close_log(self) -> None:
        self._pump.join(timeout=5)
        if not self._log.closed:
            self._log.close()

