"""The core imports and runs without the optional dependencies (pyproject extras).

Each check runs in a child interpreter whose import system refuses torch,
torchvision, transformers, scikit-learn and scipy, as on a machine where only
``pip install dblp-testbed`` (no extras) ran: the simulator, the trace tools,
the analysis and the CLIs must work; what needs an extra must say which.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("torch", "torchvision", "transformers", "sklearn", "scipy")

BLOCK = textwrap.dedent(f'''
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {OPTIONAL!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
    sys.meta_path.insert(0, _Block())
''')


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_simulator_traces_analysis_and_clis_without_optional_packages() -> None:
    r = _run(f'''
        import dblp, dblp.sim, traces, traces.cli, dblp.cli.commands, dblp.results.analysis, dblp.sim.studies.crosscheck
        import dblp.sim.cli, dblp.sim.studies.sweep, dblp.sim.studies.calibrate
        from dblp.sim.config import SimConfig
        from dblp.sim.model import simulate
        res = simulate(SimConfig(model=50_000, rounds=5))
        assert len(res.records) == 5 * 6, len(res.records)
        stat, p = dblp.sim.studies.crosscheck.ks_2samp([1, 2, 3, 4], [2, 3, 4, 5])  # numpy fallback without scipy
        assert 0 <= stat <= 1 and 0 <= p <= 1
        loaded = [m for m in sys.modules if m.split(".")[0] in {OPTIONAL!r}]
        assert not loaded, loaded
        print("ok")
    ''')
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_training_without_torch_names_the_extra() -> None:
    r = _run("import dblp.train\n")
    assert r.returncode != 0 and "dblp-testbed[train]" in r.stderr, r.stderr[-2000:]


def test_gpt2_without_transformers_names_the_extra() -> None:
    pytest.importorskip("torch")
    code = BLOCK.replace(repr(OPTIONAL), repr(("transformers",)))
    r = subprocess.run([sys.executable, "-c", code + textwrap.dedent('''
        from dblp.train.models import get_workload
        try:
            get_workload("gpt2_s", synthetic=True, synthetic_size=4, vocab_size=64, seq_len=8)
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("gpt2_s built without transformers")
    ''')], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "dblp-testbed[gpt2]" in r.stdout, r.stdout + r.stderr[-2000:]


def test_digits_ship_small_and_load_without_scikit_learn() -> None:
    f = ROOT / "dblp" / "train" / "data" / "digits.npz"
    assert f.stat().st_size < 1 << 20
    pytest.importorskip("torch")
    r = _run('''
        import sys
        sys.meta_path.pop(0)  # torch allowed; scikit-learn still refused below
        class _NoSk:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "sklearn":
                    raise ModuleNotFoundError("blocked", name=name)
        sys.meta_path.insert(0, _NoSk())
        from dblp.train.data import load_digits
        tr, te = load_digits()
        assert (len(tr), len(te)) == (1437, 360) and tr.x.shape[1:] == (1, 8, 8)
        tr3, te3 = load_digits(seed=3, test_fraction=0.25)
        assert len(te3) == 450 and len(tr3) == 1347
        print("ok")
    ''')
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_shipped_digits_equal_scikit_learns_and_keep_its_split() -> None:
    """Where scikit-learn is installed: the same images, and the default split it made before."""
    sk = pytest.importorskip("sklearn.datasets")
    ms = pytest.importorskip("sklearn.model_selection")
    pytest.importorskip("torch")
    from dblp.train.data import load_digits

    b = sk.load_digits()
    x = (b.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    xtr, xte, ytr, yte = ms.train_test_split(x, b.target, test_size=0.2, random_state=0, stratify=b.target)
    tr, te = load_digits()
    assert np.array_equal(tr.x.numpy(), xtr) and np.array_equal(te.x.numpy(), xte)
    assert np.array_equal(tr.y.numpy(), ytr) and np.array_equal(te.y.numpy(), yte)
