"""Shared fixtures of the Mininet emulation tests.

Every test here starts real namespaces, veths, bridges, qdiscs and nft tables,
so each one needs root and Mininet's ``mnexec``; without them the tests skip
with the reason. After every test the machine must be back to clean: an
autouse fixture asserts that nothing an emulation run makes is left, and then
runs the cleanup so one failure does not cascade into the next test.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

MISSING = [t for t in ("mnexec", "nft", "tc", "ip", "iperf3") if shutil.which(t) is None]
SKIP_REASON = None
if os.geteuid() != 0:
    SKIP_REASON = "Mininet emulation tests need root (namespaces, tc, nft)"
elif MISSING:
    SKIP_REASON = f"missing tools {MISSING} (run: bash scripts/setup.sh)"
else:
    import importlib.util

    if importlib.util.find_spec("mininet") is None:
        SKIP_REASON = "mininet Python package not installed (pip install mininet==2.3.0.dev6)"

PY = sys.executable


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here) and "mininet" in item.keywords and SKIP_REASON:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(autouse=True)
def nothing_left(request):
    """Assert the test left no emulation state behind (only for tests that start nets)."""
    if "mininet" not in request.keywords or SKIP_REASON:
        yield
        return
    from emulation.cleanup import cleanup, leftovers

    cleanup(verbose=False)  # a previous crashed test must not fail this one
    yield
    left = leftovers()
    cleanup(verbose=False)
    assert not any(left.values()), f"emulation leftovers after test: {left}"


@pytest.fixture
def ready_file(tmp_path):
    """A path a receiver touches once bound, so senders never race its bind."""
    return str(tmp_path / "ready")
