"""The emulation scenarios' run: a star, a burst schedule and one policy, launched by :mod:`dblp.runs.launch`."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

from dblp.protocol.control import DEFAULT_PORT
from dblp.runs.launch import Launch, RunArgs, Runner, train_worker_argv

__all__ = ["run_with_bursts", "run_scenario_policy", "run_replicates", "scenario_run_args", "SCENARIO_PORT"]

# -- the emulation scenarios' run: a star, a burst schedule, one policy ----------------------------
#: the server's TCP control port in the emulation scenarios
SCENARIO_PORT = DEFAULT_PORT


def scenario_run_args(a: Any, policy: list[str], *, python: str = sys.executable) -> RunArgs:
    """:class:`RunArgs` from the emulation scenarios' shared flags (``dblp.cli.args.add_run_args``).

    ``--gso``: the transport sends with UDP GSO; :func:`run_scenario_policy` then runs the star on
    segmented links (:meth:`emulation.loss.LossController.use_segmented_links`), where the loss rules
    still drop single datagrams. Without it: one datagram per message (the plain path)."""
    from dblp.cli.args import pace_rate

    from dblp.protocol.compensation import Compensation

    extra = ["--consistency", a.consistency] if getattr(a, "consistency", "none") != "none" else []
    extra += Compensation.from_args(a).flags()  # the paper's options add none
    return RunArgs(workers=a.workers, iterations=a.iterations, model=a.elements, policy=list(policy),
                   source="emulation", pace_bps=pace_rate(a), seed=a.seed, compute_s=a.compute,
                   peer_timeout_s=60.0, plain=not a.gso, port=SCENARIO_PORT, python=python, server_extra=extra,
                   insecure=getattr(a, "insecure", False), aggregation=getattr(a, "aggregation", "server"),
                   mtu=getattr(a, "mtu", None))


def run_with_bursts(net: Runner, lc: Any, args: RunArgs, d: str | os.PathLike, schedule: Sequence[Any], *,
                    targets: Sequence[Any] | None = None, label: str = "", marks: Sequence[int] = (),
                    quiet: bool = False, env: dict | None = None, timeout_s: float | None = None,
                    train: dict | None = None) -> Path:
    """One run on a star (server ``srv``, workers ``w1..wN``) with a burst schedule switched at
    round boundaries (:class:`emulation.bursts.BurstInjector` on ``lc``, clocked by the server's
    round hook, :class:`~dblp.transport.watch.RoundHookServer`: a burst is on from its round's first
    datagram to its last). Writes ``d/records/``, ``d/logs/``, ``d/bursts.jsonl``;
    returns ``d``. ``train``: real training workers (:func:`dblp.runs.launch.train_worker_argv`, each
    in ``d/w<i>/``) instead of replayed gradients. ``targets``: the schedule's default loss targets (the server's link, UDP, both
    directions; in the sharded mode, where srv carries nothing, every worker's incoming link: a datagram
    between two hosts meets the loss once, at its receiver, and a host's own shard never crosses a link). ``marks``: iterations whose start is printed (with a :class:`dblp.cli.progress.Progress`
    line, ETA included, every few seconds) unless ``quiet``.
    """
    from dblp.cli.progress import Progress
    from dblp.transport.watch import RoundHookServer

    from .bursts import BurstInjector
    from .loss import LossTarget

    d = Path(d)
    workers = [f"w{i + 1}" for i in range(args.workers)]
    if targets is None and args.aggregation == "sharded":
        targets = [LossTarget(w, "ingress", "udp") for w in workers]
    elif targets is None:
        targets = [LossTarget("srv", "ingress", "udp"), LossTarget("srv", "egress", "udp")]
    # The server tells each round before it opens (and waits): bursts hit the round they name.
    hook_dir = tempfile.mkdtemp(prefix="dblp-hook-")  # a short path: Unix socket names have 108 bytes
    hook = os.path.join(hook_dir, "rounds.sock")
    args = replace(args, server_extra=[*args.server_extra, "--round-hook", hook])
    try:
        with BurstInjector(lc, schedule, targets, log_path=d / "bursts.jsonl") as inj:
            progress = Progress(args.iterations, label)

            def on_rounds(first: int, last: int) -> bool:
                on = inj.on_rounds(first, last)
                if not quiet:
                    progress.update(last, force=last in marks or last - 1 in marks)
                return on

            program = None
            if train is not None:
                def program(i: int, server: str, records: Path) -> list[str]:
                    return train_worker_argv(args, train, i, server, records, d / f"w{i}")
            with RoundHookServer(hook, on_rounds), \
                    Launch(net, "srv", workers, args, records_dir=d / "records", log_dir=d / "logs", env=env,
                           worker_program=program) as run:
                run.wait(timeout_s if timeout_s is not None else 60 + args.iterations * 30)
    finally:
        shutil.rmtree(hook_dir, ignore_errors=True)
    return d


def run_scenario_policy(name: str, a: Any, net: Runner, lc: Any, out: str | os.PathLike, schedule: Sequence[Any], *,
                        python: str = sys.executable, env: dict | None = None, into: str | None = None) -> Path:
    """The emulation scenarios' run of the named policy ``name`` (``reliable``/``baseline``/``dblp``)
    with their shared flags ``a``, into ``out/<name>/`` (``out/<into>/`` when given)."""
    from dblp.protocol.policy import run_policy

    flags = run_policy(name, a.p_low, a.p_high, a.eta, a.freq).flags()
    if getattr(a, "gso", False) and not getattr(lc, "segmented", True):
        from .hostnet import host_names

        lc.use_segmented_links(host_names(net))  # GSO senders, loss still per datagram (emulation.loss)
    return run_with_bursts(net, lc, scenario_run_args(a, flags, python=python), Path(out) / (into or name), schedule,
                           label=into or name, marks=getattr(a, "bursts_list", ()), quiet=a.quiet, env=env,
                           train=getattr(a, "train", None))


def run_replicates(a: Any, net: Runner, lc: Any, out: str | os.PathLike, schedule: Sequence[Any], *,
                   policies: Sequence[str], calm: Sequence[str] = (), seeds: Sequence[int] = (0,),
                   variants: Sequence[tuple[str, dict]] = (), python: str = sys.executable,
                   env: dict | None = None,
                   around: Callable[[str, int, Path], ContextManager[Any]] | None = None) -> dict[int, dict[str, Path]]:
    """Every named policy once per seed, interleaved (seed s of every policy back to back, so a drift
    of the shared machine hits all policies alike), into :func:`dblp.results.trainreport.replicate_dir`
    (``out`` itself with one seed, ``out/seed<s>/`` with several); ``calm``: policies also run
    without the bursts, into ``<that>/calm/<policy>/`` (a variant's label there: that variant). ``variants``: extra runs ``(label, flags)``
    per seed, e.g. ``("dblp-eta0.1-freq5", {"eta": 0.1, "freq": 5})``, run as ``dblp`` with those of
    ``a``'s flags replaced, into ``<that>/<label>/``. The schedule is the same for every seed
    (common random numbers). ``around(label, seed, run folder)``: a context entered around each run
    (e.g. ``scenarios/trace_replay.py``'s trace replayer, which must start and stop with the run).
    Returns seed -> label -> run folder; prints a line per run."""
    from contextlib import nullcontext

    import argparse
    import time

    from dblp.results.trainreport import replicate_dir

    done: dict[int, dict[str, Path]] = {}
    total = len(seeds) * (len(policies) + len(calm) + len(variants))
    k = 0
    for seed in seeds:
        d = replicate_dir(out, seed, len(seeds))
        sa = argparse.Namespace(**{**vars(a), "seed": seed})
        flags_of = dict(variants)
        runs: list[tuple[str, str, Any, Path, Sequence[Any], str | None]] = \
            [(n, n, sa, d, schedule, None) for n in policies]
        runs += [(label, "dblp", argparse.Namespace(**{**vars(sa), **flags}), d, schedule, label)
                 for label, flags in variants]
        runs += [(f"{n} (no bursts)", "dblp" if n in flags_of else n,
                  argparse.Namespace(**{**vars(sa), **flags_of[n]}) if n in flags_of else sa, d / "calm", [],
                  n if n in flags_of else None) for n in calm]
        for label, policy, ra, where, sch, into in runs:
            k += 1
            t = time.time()
            print(f"- [{k}/{total}] seed {seed}: {label}", flush=True)
            with around(label, seed, where / (into or policy)) if around else nullcontext():
                got = run_scenario_policy(policy, ra, net, lc, where, sch, python=python, env=env, into=into)
            done.setdefault(seed, {})[label] = got
            print(f"  {label} done in {time.time() - t:.0f} s", flush=True)
    return done
