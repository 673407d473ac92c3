"""The programs the launcher starts on the hosts: the worker that writes what the run gathers, and more.

``python -m emulation.hosts worker ...`` (under ``torchrun`` for training):
a :class:`dblp.transport.worker.Worker` replaying synthetic gradients, or training a
:mod:`dblp.train` workload through it, writing ``records.jsonl``,
``compute.csv`` and ``device.json`` into ``--out`` (``--exchange gloo|nccl``:
the same training with torch's all-reduce, the yardstick). ``python -m
emulation.hosts facts`` prints what a host is (preflight: commit, versions,
CUDA, the workload's data set). ``python -m emulation.hosts keep`` is the
kept agent of a policy run: nft for the launcher (libnftables through
:class:`emulation.nft.LibNftBackend`) and the server's round hook relayed.
Nothing here starts networks.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from traces.argtypes import count_arg, float_arg, int_arg
from traces.units import duration_arg

from dblp.cli.args import PACE_HELP, add_auth_args, pace_arg, worker_secret

from .inventory import MODES


def host_facts(with_torch: bool = False, workload: str | None = None, data_root: str = "",
               synthetic: bool = False) -> dict:
    """What a host is: name, python, CPU, GPUs (nvidia-smi; torch.cuda with ``with_torch``), the
    checkout's commit and the package versions (:func:`dblp.cli.provenance.provenance`), and with
    ``workload`` whether its data set is there (``dataset_problem``: None, or why not).

    Why all of it before a run: a worker on another commit, without torch or without its data
    set fails minutes later inside ``torchrun``, whose error box does not say why."""
    f: dict[str, Any] = {"hostname": socket.gethostname(), "python": sys.version.split()[0],
                         "executable": sys.executable, "platform": platform.platform(),
                         "cpus": os.cpu_count(), "cpu": _cpu_model(), "gpus": [], "cuda_available": False}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=20)
            f["gpus"] = [x.strip() for x in r.stdout.splitlines() if x.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    if with_torch:
        try:
            import torch

            f["torch"] = torch.__version__
            f["cuda_available"] = bool(torch.cuda.is_available())
            if f["cuda_available"]:
                f["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                f["cuda"] = torch.version.cuda
        except Exception as exc:  # noqa: BLE001
            f["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import dblp
        from dblp.cli.provenance import provenance

        f["dblp"] = str(Path(dblp.__file__).resolve().parent)
        p = provenance()
        f.update(commit=p["git_commit"], dirty=p["git_dirty"],
                 versions={k: p["packages"].get(k) for k in ("dblp-testbed", "numpy", "torch")})
    except Exception as exc:  # noqa: BLE001
        f["provenance_error"] = f"{type(exc).__name__}: {exc}"
    if workload:
        try:
            from dblp.train.models import dataset_problem

            f["dataset_problem"] = dataset_problem(workload, data_root or None, synthetic=synthetic)
        except Exception as exc:  # noqa: BLE001 - torch missing, unknown workload: said by name
            f["dataset_problem"] = f"cannot check the data set of {workload!r}: {type(exc).__name__}: {exc}"
    return f


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _device_name(dev: Any) -> str:
    if getattr(dev, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_name(dev)
    return f"cpu ({_cpu_model()})"


def worker_main(a: argparse.Namespace) -> int:
    """The worker program on a host: a :class:`dblp.transport.worker.Worker` replaying synthetic gradients or
    training a :mod:`dblp.train` workload; writes records.jsonl, compute.csv and device.json in ``--out``."""
    from dblp.protocol.records import RecordWriter
    from dblp.transport.worker import Worker

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    host = os.environ.get("DBLP_HOSTS_HOST", socket.gethostname())
    rank = a.id
    if rank < 0 and "RANK" in os.environ:  # under torchrun
        rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    server_host, _, server_port = a.server.rpartition(":")
    comp = open(out / "compute.csv", "w", newline="", encoding="utf-8")
    cw = csv.DictWriter(comp, ["worker", "round", "compute_s", "exchange_s", "iteration_s", "device"])
    cw.writeheader()
    writer = RecordWriter(out / "records.jsonl")
    info: dict[str, Any] = {"host": host, "rank": rank, "local_rank": local_rank, "mode": a.mode,
                            "pid": os.getpid(), "torchrun": "TORCHELASTIC_RUN_ID" in os.environ}
    try:
        if a.mode == "synthetic":
            from dblp.runs.gradients import ReplayGradients, model_elements, synthetic_norms

            elements = model_elements(a.model)
            device = f"cpu ({_cpu_model()})"
            info.update(device=device, elements=elements)
            (out / "device.json").write_text(json.dumps(info, indent=1) + "\n")
            norms = synthetic_norms(max(a.iterations, 1), a.seed)
            with Worker(server_host, int(server_port), elements=elements, worker_id=rank,
                        send_rate_bps=a.pace, peer_timeout=a.peer_timeout, source="hosts",
                        fast=False if a.plain else None, secret=worker_secret(a), insecure=a.insecure) as wk:
                grads = ReplayGradients(elements, wk.worker_id, norms, a.seed)
                for k in range(a.iterations):
                    t0 = time.perf_counter()
                    if a.compute:
                        time.sleep(a.compute)
                    g = grads(k)
                    t1 = time.perf_counter()
                    wk.allreduce(g)
                    t2 = time.perf_counter()
                    rec = wk.last_record
                    assert rec is not None
                    rec.extra.update(host=host, device=device, compute_s=t1 - t0)
                    writer.write(rec)
                    cw.writerow({"worker": wk.worker_id, "round": k, "compute_s": t1 - t0, "exchange_s": t2 - t1,
                                 "iteration_s": t2 - t0, "device": device})
                    comp.flush()
            return 0
        # -- training ------------------------------------------------------------------
        import torch

        from dblp.train.exchange import AllreduceExchange
        from dblp.train.loop import TrainConfig, iterations_per_epoch, resolve_device, train
        from dblp.train.models import WORKLOAD_DEFAULTS, get_workload, workload_key

        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
        else:
            device = resolve_device("cpu")
        batch = a.batch_size or int(WORKLOAD_DEFAULTS[workload_key(a.workload)]["batch_size"])
        # synthetic data: exactly as many random samples as the run's batches need (the default 64 would not)
        wl = get_workload(a.workload, a.data_root or None, synthetic=a.synthetic_data, seed=a.seed,
                          synthetic_size=max(64, a.world_size * a.train_iterations * batch))
        over: dict[str, Any] = dict(epochs=a.epochs, max_iters_per_epoch=a.train_iterations, rank=rank,
                                    world_size=a.world_size, device=str(device), out_dir=str(out / "train"),
                                    seed=a.seed, eval_max_batches=a.eval_batches or None)
        if a.batch_size:
            over["batch_size"] = a.batch_size
        if a.lr:
            over["lr"] = a.lr
        if a.threads:
            over["threads"] = a.threads
        cfg = TrainConfig.for_workload(wl, **over)
        iters = iterations_per_epoch(wl, cfg)
        if iters != a.train_iterations:
            raise SystemExit(f"emulation.hosts worker {rank}: only {iters} iterations of batch {cfg.batch_size} fit this "
                             f"worker's shard, the run needs train.iterations = {a.train_iterations} (lower it)")
        name = _device_name(device)
        n_params = sum(p.numel() for p in wl.model.parameters() if p.requires_grad)
        info.update(device=name, device_index=str(device), workload=wl.name, parameters=n_params,
                    cuda_available=torch.cuda.is_available(), torch=torch.__version__)
        (out / "device.json").write_text(json.dumps(info, indent=1) + "\n")
        if a.exchange != "dblp":
            return _train_torch_allreduce(a, wl, cfg, rank, host, name, writer, cw, comp, out)
        with Worker(server_host, int(server_port), elements=n_params, worker_id=rank,
                    send_rate_bps=a.pace, peer_timeout=a.peer_timeout, source="hosts",
                    fast=False if a.plain else None, secret=worker_secret(a), insecure=a.insecure) as wk:
            def on_iteration(it: dict) -> None:
                rec = wk.last_record
                if rec is not None:
                    rec.extra.update(host=host, device=name, compute_s=it["compute_s"], loss=it.get("loss"))
                    writer.write(rec)
                cw.writerow({"worker": wk.worker_id, "round": it["iteration"], "compute_s": it["compute_s"],
                             "exchange_s": it["exchange_latency_s"], "iteration_s": it["iteration_s"],
                             "device": name})
                comp.flush()

            s = train(wl, AllreduceExchange(wk), cfg, on_iteration=on_iteration)
            (out / "train_summary.json").write_text(json.dumps(s.to_dict(), indent=1, default=str) + "\n")
        return 0
    finally:
        writer.close()
        comp.close()



def _train_torch_allreduce(a: argparse.Namespace, wl: Any, cfg: Any, rank: int, host: str, name: str,
                           writer: Any, cw: csv.DictWriter, comp: Any, out: Path) -> int:
    """The same training with torch's own all-reduce (``--exchange gloo|nccl``): the yardstick.

    Why here and not in a scenario: it must run on the same hosts, from the same
    inventory, with the same workload, batches and seed as the DBLP runs it is
    compared with, and write the same ``compute.csv`` and per-round records
    (``policy`` = the backend, ``round_latency_s`` = the all-reduce time;
    no server side). The process group rendezvous is torchrun's (``env://``) or
    ``--dist-init``; gloo/NCCL use ``--iface`` unless ``GLOO_SOCKET_IFNAME`` /
    ``NCCL_SOCKET_IFNAME`` are set already."""
    from datetime import timedelta

    import torch.distributed as dist

    from dblp.protocol.records import RoundRecord
    from dblp.train.exchange import TorchDistExchange
    from dblp.train.loop import train

    if a.iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", a.iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", a.iface)
    timeout = timedelta(seconds=max(a.peer_timeout, 30.0))
    if "MASTER_ADDR" in os.environ and not a.dist_init:  # under torchrun
        dist.init_process_group(a.exchange, timeout=timeout)
    else:
        dist.init_process_group(a.exchange, init_method=a.dist_init, rank=rank, world_size=a.world_size,
                                timeout=timeout)
    try:
        ex = TorchDistExchange()

        def on_iteration(it: dict) -> None:
            writer.write(RoundRecord(source="hosts", role="worker", worker=rank, round=it["iteration"],
                                     t_start=time.time() - it["iteration_s"], policy=a.exchange,
                                     round_latency_s=it["exchange_latency_s"],
                                     extra={"host": host, "device": name, "compute_s": it["compute_s"],
                                            "loss": it.get("loss")}))
            cw.writerow({"worker": rank, "round": it["iteration"], "compute_s": it["compute_s"],
                         "exchange_s": it["exchange_latency_s"], "iteration_s": it["iteration_s"], "device": name})
            comp.flush()

        s = train(wl, ex, cfg, on_iteration=on_iteration)
        (out / "train_summary.json").write_text(json.dumps(s.to_dict(), indent=1, default=str) + "\n")
    finally:
        dist.destroy_process_group()
    return 0


def add_worker_args(w: argparse.ArgumentParser) -> None:
    """The agent's flags (written by :func:`emulation.hosts.commands.worker_argv`)."""
    w.add_argument("--server", required=True, help="the server's HOST:PORT")
    w.add_argument("--id", type=int_arg(-1), default=-1, help="worker id (-1: $RANK under torchrun)")
    w.add_argument("--out", required=True, help="folder for records.jsonl, compute.csv, device.json")
    w.add_argument("--mode", choices=MODES, default="synthetic", help="synthetic gradients or training")
    w.add_argument("--iterations", type=count_arg(1), default=100, help="iterations (rounds) of the run")
    w.add_argument("--model", default="1e6", help="synthetic gradient size: a model name or an element count")
    w.add_argument("--compute", type=duration_arg(), default="0",
                   help="simulated compute per iteration (synthetic), e.g. 5ms; a bare number is seconds")
    w.add_argument("--seed", type=int_arg(0), default=0, help="seed of the synthetic gradients and the training")
    w.add_argument("--pace", type=pace_arg, default="auto", help=PACE_HELP)
    w.add_argument("--plain", action="store_true", help="disable UDP GSO/GRO")
    add_auth_args(w, "worker")
    w.add_argument("--peer-timeout", type=duration_arg(allow_zero=False), default="60s",
                   help="silence before the server is declared dead")
    w.add_argument("--source", default="hosts", help="record source tag")
    w.add_argument("--workload", default="small_cnn", help="training workload (dblp.train.models)")
    w.add_argument("--epochs", type=count_arg(1), default=1, help="training epochs")
    w.add_argument("--train-iterations", type=count_arg(1), default=20, help="training iterations per epoch")
    w.add_argument("--world-size", type=count_arg(1), default=1, help="workers in the training")
    w.add_argument("--batch-size", type=count_arg(1), default=None, help="training batch size (default: the workload's)")
    w.add_argument("--lr", type=float_arg(0.0, lo_open=True), default=None, help="learning rate (default: the workload's)")
    w.add_argument("--threads", type=count_arg(1), default=None, help="torch CPU threads (default: torch's)")
    w.add_argument("--data-root", default="", help="dataset folder (default: the workload's)")
    w.add_argument("--synthetic-data", action="store_true", help="random data of the dataset's shape")
    w.add_argument("--exchange", choices=["dblp", "gloo", "nccl"], default="dblp",
                   help="dblp: through the DBLP server; gloo/nccl: torch's all-reduce among the workers")
    w.add_argument("--iface", default="", help="gloo/nccl: the network interface (GLOO_/NCCL_SOCKET_IFNAME)")
    w.add_argument("--dist-init", default="",
                   help="gloo/nccl without torchrun: the process group's init URL, e.g. tcp://10.0.0.2:29400")
    w.add_argument("--eval-batches", type=int, default=0,
                   help="test batches per evaluation (default 0: the whole test set)")


# -- the kept connection: nft for the launcher, the server's round hook relayed ---------------------
def _nft_argv(argv: list[str]) -> tuple[str, bool] | None:
    """``nft [-j] -f -`` / ``nft [-j] COMMAND...`` as (libnftables command, JSON output); None: not nft."""
    if not argv or argv[0] != "nft":
        return None
    rest, json_out = list(argv[1:]), False
    if rest[:1] == ["-j"]:
        rest, json_out = rest[1:], True
    if rest == ["-f", "-"]:
        return "", json_out
    if any(a.startswith("-") for a in rest):
        return None
    return " ".join(rest), json_out


def keep_main(a: argparse.Namespace) -> int:
    """``python -m emulation.hosts keep``: the long-lived agent the launcher keeps one connection to.

    Why: a loss burst named for round k must be on when round k starts. One ssh
    process per rule switch put bursts 21-85 ms late on real hosts; over this
    kept connection a switch is a line each way, and ``nft`` runs in this
    process through libnftables (~0.05 ms, where it loads and we are root;
    otherwise the nft command, ~2 ms). With ``--round-hook`` it also serves
    the DBLP server's round hook (:class:`dblp.transport.watch.RoundHookServer`, a Unix
    socket on this host) and relays each call to the launcher, waiting for its
    answer: nothing of round k leaves the server before the launcher switched
    the bursts of round k, on whichever hosts they are.

    Protocol (JSON lines; stdout carries only these): launcher -> agent
    ``{"id", "op": "run", "argv", "input", "timeout"}``, ``{"op": "answer", "seq", "active"}``,
    ``{"op": "quit"}``; agent -> launcher ``{"ev": "ready", "hook", "nft"}``, replies
    ``{"id", "rc", "stdout", "stderr", "t"}`` and ``{"ev": "rounds", "seq", "first", "last", "t"}``,
    then ``{"ev": "answered", "seq", "t"}`` (times: this host's clock). End of input ends it.
    """
    import itertools
    import tempfile
    import threading

    from dblp.transport.watch import RoundHookServer

    from .keep import urgent

    raised = urgent()  # before any thread starts: the hook's and the command threads inherit it
    out_lock = threading.Lock()

    def emit(d: dict) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(d) + "\n")
            sys.stdout.flush()

    waiting: dict[int, tuple[threading.Event, list]] = {}
    seq = itertools.count()
    hook: RoundHookServer | None = None
    hook_dir = None

    def on_rounds(first: int, last: int) -> bool | None:
        s = next(seq)
        ev, box = threading.Event(), [None]
        waiting[s] = (ev, box)
        emit({"ev": "rounds", "seq": s, "first": first, "last": last, "t": time.time()})
        ok = ev.wait(a.hook_timeout)
        waiting.pop(s, None)
        emit({"ev": "answered", "seq": s, "t": time.time(), "late": not ok})
        return box[0] if ok else None

    def serve() -> None:
        """Read the launcher's lines and run its commands, on this thread (LibNftBackend's setns
        would move the main thread); one thread from the pipe to nft and back, no hand-over."""
        from ..nft import LibNftBackend, have_libnftables

        backend = None
        if os.geteuid() == 0 and have_libnftables():
            try:
                backend = LibNftBackend()
                backend.open_thread()
            except OSError:
                backend = None
        emit({"ev": "ready", "hook": hook.path if hook else None,
              "nft": "libnftables" if backend else "nft command", "pid": os.getpid(), "urgent": raised})
        try:
            for line in sys.stdin:
                try:
                    req = json.loads(line)
                except json.JSONDecodeError:
                    print(f"keep: not JSON: {line[:200]!r}", file=sys.stderr)
                    continue
                op = req.get("op")
                if op == "quit":
                    break
                if op == "answer":
                    w = waiting.get(int(req["seq"]))
                    if w is not None:
                        w[1][0] = bool(req.get("active"))
                        w[0].set()
                elif op == "run":
                    emit({"id": req["id"], **_keep_run(req, backend), "t": time.time()})
                else:
                    print(f"keep: unknown op {op!r}", file=sys.stderr)
        finally:
            if backend is not None:
                backend.close()

    try:
        if a.round_hook:
            hook_dir = tempfile.mkdtemp(prefix="dblp-hook-")  # short: a Unix socket name has 108 bytes
            hook = RoundHookServer(os.path.join(hook_dir, "rounds.sock"), on_rounds)
            hook.start()
        server = threading.Thread(target=serve, name="keep", daemon=True)
        server.start()
        server.join()
    finally:
        for ev, _ in list(waiting.values()):
            ev.set()
        if hook is not None:
            hook.stop()
        if hook_dir:
            shutil.rmtree(hook_dir, ignore_errors=True)
    return 0


def _keep_run(req: dict, backend: Any) -> dict:
    """One ``run`` request of the kept agent: nft through libnftables when ``backend`` is one and the
    command is plain ``nft``, else the program; ``{"rc", "stdout", "stderr"}``."""
    argv, inp = list(req["argv"]), req.get("input")
    parsed = _nft_argv(argv) if backend is not None else None
    try:
        if parsed is not None:
            cmd, json_out = parsed
            try:
                return {"rc": 0, "stdout": backend.output(None, (inp or "") if cmd == "" else cmd, json_out),
                        "stderr": ""}
            except RuntimeError as exc:
                return {"rc": 1, "stdout": "", "stderr": str(exc)}
        r = subprocess.run(argv, input=inp, capture_output=True, text=True, timeout=float(req.get("timeout") or 60))
        return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": 127, "stdout": "", "stderr": f"{type(exc).__name__}: {exc}"}


def add_keep_args(k: argparse.ArgumentParser) -> None:
    """The kept agent's flags (written by :class:`emulation.hosts.keep.KeptHost`)."""
    k.add_argument("--round-hook", action="store_true",
                   help="serve the DBLP server's round hook on a Unix socket here and relay it to the launcher")
    k.add_argument("--hook-timeout", type=duration_arg(allow_zero=False), default="30s",
                   help="wait at most this long for the launcher's answer to a round (then: no burst)")
