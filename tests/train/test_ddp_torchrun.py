"""A plain DDP script launched with torchrun switches to DBLP with two lines.

The script below is an ordinary ``torchrun`` DDP script (gloo, CPU); the two
lines marked ``# DBLP`` are all it takes: :class:`dblp.train.DBLPComm` starts
the server on rank 0 for the world size, registers the hook, and closes
cleanly. The run must train (loss falls), exit 0 on both ranks, and leave the
server's and the workers' round records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dblp.protocol.control import DEFAULT_PORT
from dblp.protocol.records import read_records

ROOT = Path(__file__).resolve().parents[2]
STEPS = 30

SCRIPT = textwrap.dedent(f'''
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from dblp.train import DBLPComm                                          # DBLP

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)

    def train():
        losses = []
        for step in range({STEPS}):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with open(os.path.join(sys.argv[1], f"losses{{rank}}.json"), "w") as fh:
            json.dump(losses, fh)

    if sys.argv[4] == "with":
        with DBLPComm(model, policy=sys.argv[2], records=sys.argv[1], port=int(sys.argv[3])):  # DBLP
            train()
        dist.destroy_process_group()
    else:  # no close(): the comm closes itself at interpreter exit
        DBLPComm(model, policy=sys.argv[2], records=sys.argv[1], port=int(sys.argv[3]),
                 local=False)  # (UDP datagrams: "with" above takes the host-local slot, local="auto")
        train()
''')


def _torchrun(tmp_path: Path, policy: str, port: int, how: str = "with") -> subprocess.CompletedProcess:
    script = tmp_path / "ddp_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(tmp_path / "run"), policy, str(port), how],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["with", "atexit"])
def test_torchrun_ddp_script_over_dblp(tmp_path: Path, how: str) -> None:
    r = _torchrun(tmp_path, "dblp", 0, how)  # port 0: a free one (the default is DEFAULT_PORT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = tmp_path / "run"
    for rank in (0, 1):
        losses = json.loads((run / f"losses{rank}.json").read_text())
        assert len(losses) == STEPS and losses[-1] < 0.5 * losses[0], losses
    server = list(read_records(run / "server.jsonl"))
    assert {r.role for r in server} == {"server"} and max(r.round for r in server) == STEPS - 1
    for rank in (0, 1):
        assert len(list(read_records(run / f"worker{rank}.jsonl"))) == STEPS
    assert "served" in (run / "server.log").read_text()
    cfg = json.loads((run / "config.json").read_text())  # provenance beside the records
    assert (cfg["policy"], cfg["world_size"]) == ("dblp", 2) and cfg["_run"]["packages"]["torch"]
    assert DEFAULT_PORT != 29500  # torch's own rendezvous port stays free


@pytest.mark.timeout(120)
def test_server_that_cannot_start_is_reported_on_every_rank(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:  # the server's port is taken: both ranks must say so, not hang
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        r = _torchrun(tmp_path, "dblp", busy.getsockname()[1])
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert out.count("did not start") >= 2, out[-3000:]


def test_dblpcomm_refuses_a_bad_local_by_name() -> None:
    """``local`` is True, False or "auto"; anything else is refused before a process group is needed."""
    from dblp.train import DBLPComm

    with pytest.raises(ValueError, match="local must be True, False or 'auto', got 'yes'"):
        DBLPComm(object(), local="yes")
