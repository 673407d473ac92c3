"""The command lines a run starts on its hosts: the server, the workers (or torchrun), the shell around them.

The programs' flags are written by :mod:`dblp.runs.launch` (the one place
for ``python -m dblp server``/``worker`` command lines); here they get the
inventory's values, the remote run folder and, for training, torchrun.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Sequence

from dblp.cli.args import pace_arg
from dblp.protocol.policy import run_policy

from dblp.protocol.auth import SECRET_ENV
from dblp.runs.launch import RunArgs, server_argv as _server_argv, worker_argv as _worker_argv
from .inventory import HostSpec, Inventory, RunSpec

#: the program every worker host runs (its flags: emulation.hosts.agent)
AGENT = ("-m", "emulation.hosts", "worker")


def policy_args(policy: str, run: RunSpec) -> list[str]:
    """Server flags of one named run (``baseline`` = fixed p = P_low), from :mod:`dblp.protocol.policy`."""
    return run_policy(policy, run.p_low, run.p_high, run.eta, run.freq).flags()


def host_script(host: HostSpec, rdir: str, tag: str, argv: Sequence[str], secret: str | None = None) -> str:
    """The shell line run on a host: make the run folder, write the pid file, exec the program.

    ``exec`` keeps the shell's pid, so ``<rdir>/<tag>.pid`` names the program
    itself, and the launcher can end it even when the ssh client is gone.
    ``secret``: the run's shared secret, handed over in ``$DBLP_SECRET``
    (:mod:`dblp.protocol.auth`; logs show it as ``***``, :func:`redact`).
    """
    env = {"PYTHONPATH": host.workdir, "PYTHONUNBUFFERED": "1", "DBLP_HOSTS_HOST": host.name, **host.env}
    if secret:
        env[SECRET_ENV] = secret
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (f"mkdir -p {shlex.quote(rdir)} && cd {shlex.quote(host.workdir)} && "
            f"echo $$ > {shlex.quote(rdir + '/' + tag + '.pid')} && exec env {envs} {shlex.join(list(argv))}")



def redact(script: str, secret: str | None) -> str:
    """A host script as logs may show it: the secret replaced by ``***``."""
    return script.replace(secret, "***") if secret else script


def run_args(inv: Inventory, policy: str, python: str) -> RunArgs:
    """The inventory's run as :class:`dblp.runs.launch.RunArgs`."""
    r = inv.run
    return RunArgs(workers=len(inv.workers), iterations=inv.rounds, model=r.model, policy=policy_args(policy, r),
                   source="hosts", pace_bps=pace_arg(r.rate), seed=r.seed, compute_s=r.compute_ms / 1e3,
                   peer_timeout_s=r.peer_timeout_s, plain=inv.plain, port=r.port, python=python,
                   insecure=inv.insecure)


def server_argv(inv: Inventory, policy: str, rdir: str, bind: str, port: int,
                round_hook: str | None = None) -> list[str]:
    """``python -m dblp server`` on the server host, records into its run folder ``rdir``;
    ``round_hook``: the Unix socket of the server host's kept agent (``--round-hook``)."""
    a = run_args(inv, policy, inv.server.python)
    if round_hook:
        a = replace(a, server_extra=[*a.server_extra, "--round-hook", round_hook])
    return _server_argv(a, f"{rdir}/records.jsonl", bind=bind, port=port)


def worker_argv(inv: Inventory, host: HostSpec, wid: int, rdir: str, server: str, port: int,
                master: str | None = None, exchange: str = "dblp") -> list[str]:
    """The worker's program: ``python -m emulation.hosts worker ...``, under torchrun for training.

    ``exchange``: ``dblp`` (through the DBLP server at ``server:port``) or ``gloo``/``nccl``
    (torch's all-reduce among the workers, rendezvous on ``master``; ``server`` unused)."""
    r, t = inv.run, inv.train
    a = run_args(inv, "reliable", host.python)
    argv = _worker_argv(a, wid, f"{server or master}:{port or t.torchrun_port}", None, program=AGENT)
    agent = argv[len(AGENT) + 1:]  # the flags after the program
    agent += ["--out", rdir, "--mode", r.mode]
    if exchange != "dblp":
        agent += ["--exchange", exchange, "--iface", host.intf]
    if r.mode == "synthetic":
        return [host.python, *AGENT, *agent]
    i = agent.index("--id")
    del agent[i:i + 2]  # under torchrun the id is its RANK
    agent += ["--workload", t.workload, "--epochs", str(t.epochs), "--train-iterations", str(t.iterations),
              "--world-size", str(len(inv.workers))]
    for flag, v in (("--batch-size", t.batch_size), ("--lr", t.lr), ("--threads", t.threads or None),
                    ("--eval-batches", t.eval_batches or None)):
        if v is not None:
            agent += [flag, str(v)]
    if t.data_root:
        agent += ["--data-root", t.data_root]
    if t.synthetic_data:
        agent.append("--synthetic-data")
    if t.launcher == "python":
        if exchange != "dblp":
            agent += ["--dist-init", f"tcp://{master}:{t.torchrun_port}"]
        return [host.python, *AGENT, "--id", str(wid), *agent]
    # torchrun: static rendezvous on the first worker; RANK (= node rank) becomes the DBLP worker id
    return [host.python, "-m", "torch.distributed.run", f"--nnodes={len(inv.workers)}", "--nproc-per-node=1",
            f"--node-rank={wid}", f"--master-addr={master}", f"--master-port={t.torchrun_port}", *AGENT, *agent]
