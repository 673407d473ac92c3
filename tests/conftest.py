"""Every test process shares one run secret unless a test says otherwise.

The server and workers are authenticated by default (dblp.protocol.auth): they find
the run's secret in $DBLP_SECRET, as a launcher hands it out. Tests that
start a server and workers in one process (or as plain subprocesses) get
this fixed one; tests of the authentication itself set their own, or
none, explicitly.
"""

import os

TEST_SECRET = "5ec7e7" * 10 + "0a0b"  # 64 hex digits; a test fixture, never a real run's
os.environ.setdefault("DBLP_SECRET", TEST_SECRET)
