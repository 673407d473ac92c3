"""Run the real DBLP server and workers on the machines of an inventory file.

    python -m dblp.hosts check hosts.toml        # validate, print the commands each host would run
    python -m dblp.hosts run hosts.toml          # run, gather every host's records into results/
    python scenarios/gpu_hosts.py hosts.toml     # the same, plus the cross-check against the simulator

The inventory (TOML, documented in ``docs/hosts.md``) names one server and
N worker hosts: addresses, ssh user, python path, checkout folder, GPU or not,
and optional nftables loss rules. Nothing here is a cluster manager: hosts are
reached with the system's ``ssh`` client (``transport = "ssh"``), training
workers are started with ``torchrun`` (``python -m torch.distributed.run``),
and two stand-ins exist for tests and demos on one machine:

* ``transport = "netns"``: every host is a network namespace on this
  machine (:class:`emulation.nshosts.NsNet`, veth links on one bridge, TBF
  shaping), so the real-host path - remote shell commands, pid files, loss
  rules through ``nft``, gathering with ``tar`` over the transport - runs end
  to end without ssh;
* ``transport = "local"``: plain processes on this machine on loopback (no
  root; no loss rules).

One run, per policy of ``[run].policies`` (in order), makes on every host a
fresh folder ``<remote_dir>/<run id>-<host>`` holding the process's pid file,
its records (``records.jsonl``, :class:`dblp.records.RoundRecord` rows with
``source="hosts"``), and on workers ``compute.csv`` and ``device.json``. The
launcher streams each process's output into a local log, applies loss rules
(static, or iteration-keyed bursts driven by the server's records), waits for
every process, then gathers each host's folder (``tar`` through the
transport: ``ssh host tar -C DIR -cf - .``), removes it, and removes its nft
table. Results::

    results/hosts-<name>-<stamp>/
        inventory.toml, config.json     the inventory as given / as resolved
        facts/<host>.json               preflight: hostname, python, torch, CUDA devices
        <policy>/records/server.jsonl   gathered per-round records
        <policy>/records/worker<i>.jsonl   (worker extra: host, device, compute_s)
        <policy>/hosts/<host>/          everything the host wrote, and its process log
        <policy>/rounds.jsonl           all records merged
        <policy>/compute.csv            per-iteration compute time of every worker
        <policy>/bursts.jsonl           loss rules applied and removed (when any)
        devices.json                    host -> device name(s) used
        compute.csv                     all policies' compute times
        sim_compute.json                compute_s / compute_jitter_s for dblp.sim (SimConfig keys)
        summary.json                    record counts per host and round, problems found

Cleanup: every process is ended (local client first, then the remote pid
from its pid file), every remote folder and nft table this run made is
removed, on success, failure and Ctrl-C alike; namespaces of the netns
transport go with :class:`NsNet` (``python -m emulation.nshosts --cleanup``
after a ``kill -9``).
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
TRANSPORTS = ("ssh", "netns", "local")
ROLES = ("server", "worker")
POLICIES = ("reliable", "baseline", "dblp")
MODES = ("synthetic", "train")
LAUNCHERS = ("torchrun", "python")
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$")
NFT_TABLE = "dblp_hosts"


class InventoryError(ValueError):
    """A bad inventory: the message names the file and the field (``hosts[2].role``)."""


class HostsError(RuntimeError):
    """A run failed: a host unreachable, a process failed, records missing."""


# ============================================================================ inventory
@dataclass
class LossRule:
    """An nftables drop rule on one host (see :class:`emulation.loss.LossTarget`).

    ``rounds`` empty: drop ``rate`` of the matching packets for the whole run;
    otherwise only during those iterations (each for ``length`` iterations),
    switched on and off as the server's records show the iterations start.
    """

    rate: float
    direction: str = "ingress"  # ingress | egress
    proto: str = "udp"  # udp | all
    dports: list[int] | None = None  # [lo, hi]
    intf: str | None = None  # default: the host's intf
    rounds: list[int] = field(default_factory=list)
    length: int = 1


@dataclass
class HostSpec:
    name: str
    role: str
    address: str = ""  # ssh target; "" for netns/local
    data_address: str = ""  # where workers reach the server (default: address)
    user: str = ""
    ssh_port: int = 22
    identity: str = ""
    ssh_options: list[str] = field(default_factory=list)
    python: str = ""
    workdir: str = ""
    gpu: bool = False
    sudo: bool = False
    intf: str = "eth0"
    env: dict[str, str] = field(default_factory=dict)
    loss: list[LossRule] = field(default_factory=list)


@dataclass
class RunSpec:
    name: str = "hosts"
    transport: str = "ssh"
    policies: list[str] = field(default_factory=lambda: ["dblp"])
    p_low: float = 0.008
    p_high: float | None = None
    eta: float = 0.5
    freq: int = 10
    mode: str = "synthetic"
    model: str = "1e6"
    rounds: int = 100
    compute_ms: float = 0.0
    port: int = 29500
    rate: str = "0"
    plain: bool | None = None  # None: True when any loss rule exists
    seed: int = 0
    remote_dir: str = "/tmp/dblp-hosts"
    keep_remote: bool = False
    timeout_s: float = 900.0
    peer_timeout_s: float = 60.0


@dataclass
class NetworkSpec:
    """What the links are: shaping for the netns transport, facts for the simulator elsewhere."""

    bandwidth: str = ""  # e.g. "1G"; netns: TBF rate of every host link ("" = unshaped)
    queue_packets: int = 100  # netns: TBF limit in 1514-byte packets


@dataclass
class TrainSpec:
    workload: str = "small_cnn"
    epochs: int = 1
    iterations: int = 20  # per epoch; every worker must manage this many
    batch_size: int | None = None
    lr: float | None = None
    data_root: str = ""
    synthetic_data: bool = False
    launcher: str = "torchrun"
    torchrun_port: int = 29400
    threads: int = 0

    @property
    def rounds(self) -> int:
        return self.epochs * self.iterations


@dataclass
class Inventory:
    run: RunSpec
    network: NetworkSpec
    train: TrainSpec
    hosts: list[HostSpec]
    path: str = ""

    @property
    def server(self) -> HostSpec:
        return next(h for h in self.hosts if h.role == "server")

    @property
    def workers(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.role == "worker"]

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in the inventory")

    @property
    def rounds(self) -> int:
        return self.train.rounds if self.run.mode == "train" else self.run.rounds

    @property
    def plain(self) -> bool:
        if self.run.plain is not None:
            return self.run.plain
        return any(h.loss for h in self.hosts)

    def to_dict(self) -> dict:
        return {"run": asdict(self.run), "network": asdict(self.network), "train": asdict(self.train),
                "hosts": [asdict(h) for h in self.hosts], "path": self.path}


_TYPES: dict[str, Any] = {}  # filled below: (class, field) -> checker


def _err(src: str, where: str, msg: str) -> InventoryError:
    return InventoryError(f"{src}: {where}: {msg}")


def _check_type(src: str, where: str, v: Any, want: Any) -> Any:
    """Check ``v`` against a field annotation string; return it normalised."""
    want = str(want).replace("typing.", "")
    opt = "None" in want
    if v is None and opt:
        return None
    base = want.replace(" | None", "")
    ok: bool
    if base == "str":
        ok = isinstance(v, str)
    elif base == "bool":
        ok = isinstance(v, bool)
    elif base == "int":
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif base == "float":
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if ok:
            v = float(v)
    elif base.startswith("list[str]"):
        ok = isinstance(v, list) and all(isinstance(x, str) for x in v)
    elif base.startswith("list[int]"):
        ok = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    elif base.startswith("dict[str, str]"):
        ok = isinstance(v, dict) and all(isinstance(x, str) for x in v)
        if ok:
            v = {k: str(x) for k, x in v.items()}
    else:  # list[LossRule]: checked by the caller
        ok = True
    if not ok:
        raise _err(src, where, f"expected {base}, got {type(v).__name__} {v!r}")
    return v


def _fill(cls: type, d: dict, src: str, where: str, skip: tuple[str, ...] = ()) -> dict:
    if not isinstance(d, dict):
        raise _err(src, where, f"expected a table, got {type(d).__name__}")
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(k for k in d if k not in names or k in skip)
    if unknown:
        raise _err(src, f"{where}.{unknown[0]}" if where else unknown[0],
                   f"unknown key; known keys: {', '.join(n for n in names if n not in skip)}")
    return {k: _check_type(src, f"{where}.{k}" if where else k, v, names[k].type) for k, v in d.items()}


def _loss_rule(d: Any, src: str, where: str) -> LossRule:
    vals = _fill(LossRule, d, src, where)
    if "rate" not in vals:
        raise _err(src, f"{where}.rate", "required (fraction of matching packets to drop, 0..1)")
    rule = LossRule(**vals)
    if not 0.0 <= rule.rate <= 1.0:
        raise _err(src, f"{where}.rate", f"must be in [0, 1], got {rule.rate}")
    if rule.direction not in ("ingress", "egress"):
        raise _err(src, f"{where}.direction", f"must be 'ingress' or 'egress', got {rule.direction!r}")
    if rule.proto not in ("udp", "all"):
        raise _err(src, f"{where}.proto", f"must be 'udp' or 'all', got {rule.proto!r}")
    if rule.dports is not None:
        if rule.proto != "udp":
            raise _err(src, f"{where}.dports", "only with proto = 'udp'")
        if len(rule.dports) != 2 or not 0 < rule.dports[0] <= rule.dports[1] < 65536:
            raise _err(src, f"{where}.dports", f"expected [lo, hi] with 0 < lo <= hi < 65536, got {rule.dports}")
    if any(r < 0 for r in rule.rounds):
        raise _err(src, f"{where}.rounds", f"iterations must be >= 0, got {rule.rounds}")
    if rule.length < 1:
        raise _err(src, f"{where}.length", f"must be >= 1, got {rule.length}")
    return rule


def parse_inventory(data: dict, src: str = "<inventory>") -> Inventory:
    """Build and validate an :class:`Inventory` from parsed TOML; errors name the field."""
    if not isinstance(data, dict):
        raise InventoryError(f"{src}: expected a TOML document")
    unknown = sorted(set(data) - {"run", "network", "train", "defaults", "hosts"})
    if unknown:
        raise _err(src, unknown[0], "unknown section; sections: run, network, train, defaults, hosts")
    run = RunSpec(**_fill(RunSpec, data.get("run", {}), src, "run"))
    if not _RUN_NAME_RE.match(run.name):
        raise _err(src, "run.name", f"use letters, digits, '_', '-', '.' (up to 41), got {run.name!r}")
    if run.transport not in TRANSPORTS:
        raise _err(src, "run.transport", f"must be one of {', '.join(TRANSPORTS)}, got {run.transport!r}")
    if not run.policies:
        raise _err(src, "run.policies", "give at least one of reliable, baseline, dblp")
    for i, p in enumerate(run.policies):
        if p not in POLICIES:
            raise _err(src, f"run.policies[{i}]", f"must be one of {', '.join(POLICIES)}, got {p!r}")
    if len(set(run.policies)) != len(run.policies):
        raise _err(src, "run.policies", f"each policy once, got {run.policies}")
    if run.mode not in MODES:
        raise _err(src, "run.mode", f"must be one of {', '.join(MODES)}, got {run.mode!r}")
    for name in ("rounds",):
        if getattr(run, name) < 1:
            raise _err(src, f"run.{name}", f"must be >= 1, got {getattr(run, name)}")
    if not 0 <= run.port < 65536:
        raise _err(src, "run.port", f"must be a TCP port, got {run.port}")
    for name in ("compute_ms", "timeout_s", "peer_timeout_s"):
        if not (getattr(run, name) >= 0 and math.isfinite(getattr(run, name))):
            raise _err(src, f"run.{name}", f"must be a non-negative number, got {getattr(run, name)}")
    if not 0 <= run.p_low <= 1 or (run.p_high is not None and not run.p_low <= run.p_high <= 1):
        raise _err(src, "run.p_high" if run.p_high is not None else "run.p_low",
                   f"need 0 <= p_low <= p_high <= 1, got p_low={run.p_low}, p_high={run.p_high}")
    try:
        from .gradients import model_elements

        model_elements(run.model)
    except Exception as exc:  # noqa: BLE001
        raise _err(src, "run.model", str(exc)) from None
    try:
        _rate_bps(run.rate)
    except ValueError as exc:
        raise _err(src, "run.rate", str(exc)) from None
    if not run.remote_dir.startswith("/") or run.remote_dir.rstrip("/") in ("", "/tmp", "/home", "/root"):
        raise _err(src, "run.remote_dir", f"must be an absolute folder of its own (runs make subfolders), got {run.remote_dir!r}")

    network = NetworkSpec(**_fill(NetworkSpec, data.get("network", {}), src, "network"))
    if network.bandwidth:
        try:
            if _rate_bps(network.bandwidth) <= 0:
                raise ValueError("must be positive")
        except ValueError as exc:
            raise _err(src, "network.bandwidth", str(exc)) from None
    if network.queue_packets < 1:
        raise _err(src, "network.queue_packets", f"must be >= 1, got {network.queue_packets}")

    train = TrainSpec(**_fill(TrainSpec, data.get("train", {}), src, "train"))
    if train.launcher not in LAUNCHERS:
        raise _err(src, "train.launcher", f"must be one of {', '.join(LAUNCHERS)}, got {train.launcher!r}")
    for name in ("epochs", "iterations"):
        if getattr(train, name) < 1:
            raise _err(src, f"train.{name}", f"must be >= 1, got {getattr(train, name)}")
    if run.mode == "train":
        from importlib.util import find_spec

        if find_spec("torch") is not None:  # the workload names are checked where torch is
            try:
                from .train.models import WORKLOADS, _ALIASES  # noqa: PLC0415

                key = _ALIASES.get(train.workload.lower().replace("-", "_"), train.workload.lower().replace("-", "_"))
                if key not in WORKLOADS:
                    raise _err(src, "train.workload", f"unknown workload {train.workload!r}; known: {', '.join(WORKLOADS)}")
            except ImportError:
                pass

    defaults = data.get("defaults", {})
    _fill(HostSpec, defaults, src, "defaults", skip=("name", "role", "address", "data_address", "loss"))
    raw_hosts = data.get("hosts")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise _err(src, "hosts", "give one [[hosts]] table per machine: one with role = 'server', the others 'worker'")
    hosts: list[HostSpec] = []
    for i, hd in enumerate(raw_hosts):
        where = f"hosts[{i}]"
        if not isinstance(hd, dict):
            raise _err(src, where, "expected a table")
        merged = {**defaults, **{k: v for k, v in hd.items() if k != "loss"}}
        vals = _fill(HostSpec, merged, src, where, skip=("loss",))
        for req in ("name", "role"):
            if req not in vals:
                raise _err(src, f"{where}.{req}", "required")
        h = HostSpec(**vals)
        raw_loss = hd.get("loss", [])
        if not isinstance(raw_loss, list):
            raise _err(src, f"{where}.loss", "expected a list of loss rules ([[hosts.loss]] tables)")
        h.loss = [_loss_rule(r, src, f"{where}.loss[{j}]") for j, r in enumerate(raw_loss)]
        if not _NAME_RE.match(h.name):
            raise _err(src, f"{where}.name", f"use 1-10 lower-case letters/digits starting with a letter, got {h.name!r}")
        if h.role not in ROLES:
            raise _err(src, f"{where}.role", f"must be 'server' or 'worker', got {h.role!r}")
        if run.transport == "ssh":
            if not h.address:
                raise _err(src, f"{where}.address", "required with transport 'ssh' (host name or IP for ssh)")
            if not h.workdir:
                raise _err(src, f"{where}.workdir",
                           "required with transport 'ssh': the folder of this repository's checkout on that host "
                           "(set it once in [defaults])")
            if not h.python:
                h.python = "python3"
        else:
            if h.address or h.data_address:
                raise _err(src, f"{where}.address",
                           f"transport {run.transport!r} assigns addresses itself; remove address/data_address")
            h.python = h.python or sys.executable
            h.workdir = h.workdir or str(ROOT)
        if run.transport == "local" and h.loss:
            raise _err(src, f"{where}.loss", "loss rules need transport 'ssh' or 'netns' (local processes share one stack)")
        if not 0 < h.ssh_port < 65536:
            raise _err(src, f"{where}.ssh_port", f"must be a TCP port, got {h.ssh_port}")
        for j, r in enumerate(h.loss):
            if r.rounds and max(r.rounds) >= (train.rounds if run.mode == "train" else run.rounds):
                raise _err(src, f"{where}.loss[{j}].rounds", f"iterations must lie below the run's rounds, got {r.rounds}")
        hosts.append(h)
    names = [h.name for h in hosts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _err(src, f"hosts[{names.index(dup[0], names.index(dup[0]) + 1)}].name", f"duplicate host name {dup[0]!r}")
    servers = [i for i, h in enumerate(hosts) if h.role == "server"]
    if len(servers) != 1:
        raise _err(src, "hosts", f"exactly one host needs role = 'server', found {len(servers)}")
    if len(hosts) < 2:
        raise _err(src, "hosts", "need at least one host with role = 'worker'")
    return Inventory(run=run, network=network, train=train, hosts=hosts, path=src)


def load_inventory(path: str | os.PathLike) -> Inventory:
    """Read and validate an inventory TOML file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InventoryError(f"{p}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{p}: not valid TOML: {exc}") from None
    return parse_inventory(data, str(p))


def _rate_bps(s: str | float) -> float:
    if isinstance(s, (int, float)):
        return float(s)
    t = s.strip().lower().removesuffix("bit/s").removesuffix("bps").removesuffix("bit")
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}
    try:
        return float(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else float(t)
    except (ValueError, KeyError):
        raise ValueError(f"bad rate {s!r}: use e.g. 0, 500M, 10G") from None


# ============================================================================ transports
class Transport:
    """How to run a shell script on a host. Subclasses: ssh, netns, local."""

    name = "?"

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def argv(self, host: HostSpec, script: str) -> list[str]:
        raise NotImplementedError

    def data_address(self, host: HostSpec) -> str:
        raise NotImplementedError

    def bind_address(self, host: HostSpec) -> str:
        return "0.0.0.0"

    def start(self, host: HostSpec, script: str, **kw: Any) -> subprocess.Popen:
        kw.setdefault("start_new_session", True)
        return subprocess.Popen(self.argv(host, script), **kw)

    def run(self, host: HostSpec, script: str, *, input: str | bytes | None = None, timeout: float = 60.0,
            text: bool = True) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.argv(host, script), input=input, capture_output=True, text=text,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise HostsError(f"host {host.name}: {script!r} took more than {timeout:g} s "
                             f"({'ssh to ' + host.address if self.name == 'ssh' else self.name})") from exc


class SshTransport(Transport):
    """``ssh [-p PORT] [-i KEY] [OPTIONS] user@address -- SCRIPT``; BatchMode, so a password prompt fails fast."""

    name = "ssh"

    def argv(self, host: HostSpec, script: str) -> list[str]:
        a = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15"]
        if host.ssh_port != 22:
            a += ["-p", str(host.ssh_port)]
        if host.identity:
            a += ["-i", os.path.expanduser(host.identity)]
        a += list(host.ssh_options)
        a += [f"{host.user}@{host.address}" if host.user else host.address, "--", script]
        return a

    def data_address(self, host: HostSpec) -> str:
        return host.data_address or host.address


class NetnsTransport(Transport):
    """Hosts as network namespaces on this machine (:class:`emulation.nshosts.NsNet`)."""

    name = "netns"

    def __init__(self, inv: Inventory) -> None:
        super().__init__(inv)
        from emulation.nshosts import NsNet, Shape

        shape = None
        if inv.network.bandwidth:
            shape = Shape(_rate_bps(inv.network.bandwidth), queue=inv.network.queue_packets * 1514)
        self.net = NsNet([h.name for h in inv.hosts], shape=shape)
        self.net.start()

    def close(self) -> None:
        self.net.close()

    def argv(self, host: HostSpec, script: str) -> list[str]:
        return self.net[host.name].exec_args(["sh", "-c", script])

    def start(self, host: HostSpec, script: str, **kw: Any) -> subprocess.Popen:
        return self.net[host.name].popen(["sh", "-c", script], **kw)  # ended by NsNet.close too

    def data_address(self, host: HostSpec) -> str:
        return self.net[host.name].ip

    def namespaces(self) -> list[str]:
        return self.net.namespaces()


class LocalTransport(Transport):
    """Plain local processes on loopback (no root, no loss rules): for quick checks of the launcher."""

    name = "local"

    def argv(self, host: HostSpec, script: str) -> list[str]:
        return ["sh", "-c", script]

    def data_address(self, host: HostSpec) -> str:
        return "127.0.0.1"

    def bind_address(self, host: HostSpec) -> str:
        return "127.0.0.1"


def make_transport(inv: Inventory) -> Transport:
    if inv.run.transport == "ssh":
        if shutil.which("ssh") is None:
            raise HostsError("transport 'ssh' needs the ssh client (apt-get install openssh-client)")
        return SshTransport(inv)
    if inv.run.transport == "netns":
        if os.geteuid() != 0:
            raise HostsError("transport 'netns' needs root (network namespaces)")
        return NetnsTransport(inv)
    return LocalTransport(inv)


# ============================================================================ commands
def policy_args(policy: str, run: RunSpec) -> list[str]:
    """Server flags of one policy (as scenarios/microburst.py: baseline = fixed p = P_low)."""
    if policy == "reliable":
        return ["--policy", "reliable"]
    if policy == "baseline":
        return ["--policy", "fixed", "--p", repr(run.p_low)]
    a = ["--policy", "dblp", "--p-low", repr(run.p_low), "--eta", repr(run.eta), "--freq", str(run.freq)]
    if run.p_high is not None:
        a += ["--p-high", repr(run.p_high)]
    return a


def host_script(host: HostSpec, rdir: str, tag: str, argv: Sequence[str]) -> str:
    """The shell line run on a host: make the run folder, write the pid file, exec the program.

    ``exec`` keeps the shell's pid, so ``<rdir>/<tag>.pid`` names the program
    itself, and the launcher can end it even when the ssh client is gone.
    """
    env = {"PYTHONPATH": host.workdir, "PYTHONUNBUFFERED": "1", "DBLP_HOSTS_HOST": host.name, **host.env}
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (f"mkdir -p {shlex.quote(rdir)} && cd {shlex.quote(host.workdir)} && "
            f"echo $$ > {shlex.quote(rdir + '/' + tag + '.pid')} && exec env {envs} {shlex.join(list(argv))}")


def server_argv(inv: Inventory, policy: str, rdir: str, bind: str, port: int) -> list[str]:
    r = inv.run
    a = [inv.server.python, "-m", "dblp", "server", "--host", bind, "--port", str(port),
         "--workers", str(len(inv.workers)), "--rounds", str(inv.rounds), "--records", f"{rdir}/records.jsonl",
         "--source", "hosts", "--seed", str(r.seed), "--rate", str(r.rate),
         "--peer-timeout", repr(r.peer_timeout_s)]
    if inv.plain:
        a.append("--plain")
    return a + policy_args(policy, r)


def worker_argv(inv: Inventory, host: HostSpec, wid: int, rdir: str, server: str, port: int,
                master: str | None = None) -> list[str]:
    """The worker's program: ``python -m dblp.hosts worker ...``, under torchrun for training."""
    r, t = inv.run, inv.train
    agent = ["--server", f"{server}:{port}", "--out", rdir, "--mode", r.mode, "--seed", str(r.seed),
             "--rate", str(r.rate), "--peer-timeout", repr(r.peer_timeout_s), "--rounds", str(inv.rounds)]
    if inv.plain:
        agent.append("--plain")
    if r.mode == "synthetic":
        agent += ["--id", str(wid), "--model", str(r.model), "--compute-ms", repr(r.compute_ms)]
        return [host.python, "-m", "dblp.hosts", "worker", *agent]
    agent += ["--workload", t.workload, "--epochs", str(t.epochs), "--iterations", str(t.iterations),
              "--world-size", str(len(inv.workers))]
    for flag, v in (("--batch-size", t.batch_size), ("--lr", t.lr), ("--threads", t.threads or None)):
        if v is not None:
            agent += [flag, str(v)]
    if t.data_root:
        agent += ["--data-root", t.data_root]
    if t.synthetic_data:
        agent.append("--synthetic-data")
    if t.launcher == "python":
        return [host.python, "-m", "dblp.hosts", "worker", "--id", str(wid), *agent]
    # torchrun: static rendezvous on the first worker; RANK (= node rank) becomes the DBLP worker id
    return [host.python, "-m", "torch.distributed.run", f"--nnodes={len(inv.workers)}", "--nproc-per-node=1",
            f"--node-rank={wid}", f"--master-addr={master}", f"--master-port={t.torchrun_port}",
            "-m", "dblp.hosts", "worker", *agent]


# ============================================================================ loss rules
class _HostsNet:
    """What :class:`emulation.loss.LossController` needs of a network, over a transport."""

    def __init__(self, tr: Transport) -> None:
        self.tr = tr

    def cmd(self, host: str, args: Sequence[str], *, input: str | None = None, check: bool = True,
            timeout: float = 30.0) -> str:
        h = self.tr.inv.host(host)
        script = ("sudo -n " if h.sudo else "") + shlex.join(list(args))
        r = self.tr.run(h, script, input=input, timeout=timeout)
        if check and r.returncode != 0:
            raise HostsError(f"host {host}: {script!r} failed (rc={r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def host_intf(self, host: str) -> str:
        return self.tr.inv.host(host).intf

    def pid(self, host: str) -> None:
        return None


def _loss_controller(tr: Transport):
    from emulation.loss import LossController

    class HostsLossController(LossController):
        """emulation.loss's rules and transactions, run on inventory hosts through the transport."""

        def counters(self) -> dict[str, dict]:
            with self._lock:
                targets = dict(self._installed)
            raw = {h: parse_nft_counters(self.net.cmd(h, ["nft", "-j", "list", "counters", "table", "netdev",
                                                          self.table], check=False, timeout=10))
                   for h in {h for h, _ in targets}}
            out = {}
            for (host, chain), t in targets.items():
                seen, drop = raw[host].get(f"seen_{chain}", {}), raw[host].get(f"drop_{chain}", {})
                out[t.label()] = {"host": host, "chain": chain, "rate": self._rates.get(t, 0.0),
                                  "seen_packets": seen.get("packets", 0), "seen_bytes": seen.get("bytes", 0),
                                  "dropped_packets": drop.get("packets", 0), "dropped_bytes": drop.get("bytes", 0)}
            return out

    return HostsLossController(_HostsNet(tr), table=NFT_TABLE)


def parse_nft_counters(text: str) -> dict[str, dict]:
    try:
        items = json.loads(text).get("nftables", []) if text.strip() else []
    except json.JSONDecodeError:
        return {}
    return {c["name"]: {"packets": c.get("packets", 0), "bytes": c.get("bytes", 0)}
            for c in (i.get("counter") for i in items) if c}


def loss_targets(inv: Inventory):
    """(static [(target, rate)], iteration bursts [IterationBurst]) of the inventory's rules."""
    from emulation.bursts import IterationBurst
    from emulation.loss import LossTarget

    static, keyed = [], {}
    for h in inv.hosts:
        for r in h.loss:
            t = LossTarget(h.name, r.direction, r.proto, tuple(r.dports) if r.dports else None, r.intf)
            if r.rounds:
                for k in r.rounds:  # rules of the same iterations and rate switch together
                    keyed.setdefault((k, r.length, r.rate), []).append(t)
            else:
                static.append((t, r.rate))
    bursts = [IterationBurst(k, rate, length, targets=tuple(ts)) for (k, length, rate), ts in sorted(keyed.items())]
    return static, bursts


# ============================================================================ processes
class HostProc:
    """One program on one host: the local client process, its log, and its remote pid file."""

    def __init__(self, tr: Transport, host: HostSpec, tag: str, rdir: str, argv: list[str], log: Path,
                 watch: str | None = None) -> None:
        self.tr, self.host, self.tag, self.rdir = tr, host, tag, rdir
        self.log_path = log
        self.script = host_script(host, rdir, tag, argv)
        self.pattern = re.compile(watch) if watch else None
        self.match: re.Match | None = None
        self.matched = threading.Event()
        self.tail: list[str] = []
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "w", encoding="utf-8")
        self._log.write(f"# {host.name}: {shlex.join(tr.argv(host, self.script))}\n")
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


class RoundWatcher(threading.Thread):
    """Follows the server's records on its host (``tail -F`` through the transport) and calls
    ``on_round(k)`` when iteration k starts (all workers' round k-1 rows written)."""

    def __init__(self, tr: Transport, host: HostSpec, path: str, workers: int,
                 on_round: Callable[[int], None]) -> None:
        super().__init__(daemon=True, name="round-watcher")
        self.workers, self.on_round = workers, on_round
        self.rounds = 0
        self.proc = tr.start(host, f"exec tail -n +1 -s 0.05 -F {shlex.quote(path)} 2>/dev/null",
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    def run(self) -> None:
        assert self.proc.stdout is not None
        lines = 0
        for _ in self.proc.stdout:
            lines += 1
            r = lines // self.workers
            if r != self.rounds:
                self.rounds = r
                try:
                    self.on_round(r)
                except Exception as exc:  # noqa: BLE001
                    print(f"hosts: round hook failed at iteration {r}: {exc}", file=sys.stderr)

    def stop(self) -> None:
        end_process_group(self.proc, 5.0)
        self.join(timeout=5)



def end_process_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the process's group, SIGKILL it after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait(5)

# ============================================================================ gathering
def gather_dir(tr: Transport, host: HostSpec, rdir: str, dest: Path) -> list[str]:
    """Copy a host's run folder into ``dest`` (``tar -C rdir -cf - .`` through the transport)."""
    r = tr.run(host, f"tar -C {shlex.quote(rdir)} -cf - .", timeout=300, text=False)
    if r.returncode != 0:
        raise HostsError(f"host {host.name}: cannot read {rdir}: {r.stderr.decode('utf-8', 'replace').strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(r.stdout), mode="r:") as tf:
        members = [m for m in tf.getmembers() if m.isfile() or m.isdir()]
        tf.extractall(dest, members=members, filter="data")
        return sorted(m.name for m in members if m.isfile())


def remove_dir(tr: Transport, host: HostSpec, rdir: str) -> None:
    if not re.search(r"/[A-Za-z0-9_.-]+-[a-z][a-z0-9]*$", rdir):
        raise HostsError(f"refusing to remove {rdir!r}: not a run folder")
    tr.run(host, f"rm -rf -- {shlex.quote(rdir)}", timeout=60)


# ============================================================================ the launcher
def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def _results_dir(root: Path, name: str) -> Path:
    base = root / f"hosts-{name}-{_stamp()}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    path.mkdir(parents=True)
    return path


def preflight(tr: Transport, inv: Inventory) -> dict[str, dict]:
    """Run ``python -m dblp.hosts facts`` on every host (in parallel): checks reachability,
    the python path and the checkout, and CUDA where the inventory says ``gpu = true``."""
    out: dict[str, dict] = {}
    errors: list[str] = []

    def one(h: HostSpec) -> None:
        torch_flag = " --torch" if (h.gpu or (inv.run.mode == "train" and h.role == "worker")) else ""
        script = (f"cd {shlex.quote(h.workdir)} && PYTHONPATH={shlex.quote(h.workdir)} "
                  f"{shlex.quote(h.python)} -m dblp.hosts facts{torch_flag}")
        try:
            r = tr.run(h, script, timeout=120)
        except HostsError as exc:
            errors.append(str(exc))
            return
        if r.returncode != 0:
            errors.append(f"host {h.name}: preflight failed (rc={r.returncode}); check python = {h.python!r} "
                          f"and workdir = {h.workdir!r} there: {r.stderr.strip()[-500:]}")
            return
        try:
            f = json.loads(r.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            errors.append(f"host {h.name}: preflight printed no facts: {r.stdout[-300:]!r} {r.stderr[-300:]!r}")
            return
        if h.gpu and not f.get("cuda_available"):
            errors.append(f"host {h.name}: the inventory says gpu = true but CUDA is not available there "
                          f"(torch {f.get('torch')}, devices {f.get('gpus')}, {f.get('torch_error', '')})")
        out[h.name] = f

    threads = [threading.Thread(target=one, args=(h,)) for h in inv.hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise HostsError("preflight:\n  " + "\n  ".join(errors))
    return out


def run_policy(tr: Transport, inv: Inventory, policy: str, out: Path, run_id: str,
               progress: Callable[[str], None] = print) -> dict:
    """One run of the server and workers under ``policy``; gathers into ``out``. Returns its summary."""
    hosts = inv.hosts
    rdirs = {h.name: f"{inv.run.remote_dir.rstrip('/')}/{run_id}-{policy}-{h.name}" for h in hosts}
    (out / "records").mkdir(parents=True, exist_ok=True)
    procs: list[HostProc] = []
    watcher: RoundWatcher | None = None
    injector = None
    lc = None
    started_dirs: list[HostSpec] = []
    t_begin = time.time()
    n_rounds, n_workers = inv.rounds, len(inv.workers)
    problems: list[str] = []
    failure: BaseException | None = None
    try:
        for h in hosts:
            r = tr.run(h, f"mkdir -p {shlex.quote(rdirs[h.name])}")
            if r.returncode != 0:
                raise HostsError(f"host {h.name}: cannot make {rdirs[h.name]}: {r.stderr.strip()}")
            started_dirs.append(h)
        static, bursts = loss_targets(inv)
        if static or bursts:
            lc = _loss_controller(tr)
            for t, rate in static:
                lc.set_loss(t, rate)
            if bursts:
                from emulation.bursts import BurstInjector

                injector = BurstInjector(lc, bursts, log_path=out / "bursts.jsonl").start()
                injector.on_iteration(0)
        srv = inv.server
        bind = tr.bind_address(srv)
        port = 0 if tr.name == "local" else inv.run.port
        sp = HostProc(tr, srv, "server", rdirs[srv.name],
                      server_argv(inv, policy, rdirs[srv.name], bind, port), out / "hosts" / srv.name / "server.log",
                      watch=r"listening on \S+:(\d+)")
        procs.append(sp)
        if not sp.matched.wait(60) or sp.match is None:
            raise HostsError(f"server on {srv.name} did not start listening:\n{sp.last_lines()}")
        port = int(sp.match.group(1))
        addr = tr.data_address(srv)
        master = tr.data_address(inv.workers[0])

        def on_round(k: int) -> None:
            if injector is not None:
                injector.on_iteration(k)
            if k == n_rounds or k % max(1, n_rounds // 10) == 0:
                rate = k / max(1e-9, time.time() - t_begin)
                progress(f"  {policy:9s} iteration {k:5d}/{n_rounds}  ({rate:.1f} it/s)")

        watcher = RoundWatcher(tr, srv, f"{rdirs[srv.name]}/records.jsonl", n_workers, on_round)
        watcher.start()
        for wid, h in enumerate(inv.workers):
            procs.append(HostProc(tr, h, "worker", rdirs[h.name],
                                  worker_argv(inv, h, wid, rdirs[h.name], addr, port, master),
                                  out / "hosts" / h.name / "worker.log"))
        deadline = time.time() + inv.run.timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [p for p, c in zip(procs, codes) if c not in (None, 0)]
            if failed:
                f = failed[0]
                raise HostsError(f"{policy}: {f.tag} on {f.host.name} exited with {f.poll()}; "
                                 f"log {f.log_path}:\n{f.last_lines()}")
            if all(c == 0 for c in codes):
                break
            if time.time() > deadline:
                raise HostsError(f"{policy}: not done after run.timeout_s = {inv.run.timeout_s:g} s "
                                 f"({watcher.rounds}/{n_rounds} iterations)")
            time.sleep(0.1)
    except BaseException as exc:
        failure = exc
        problems.append(f"run: {exc}")
    finally:
        if watcher is not None:
            watcher.stop()
        if injector is not None:
            injector.stop()
        for p in procs:
            p.stop()
        gathered: dict[str, list[str]] = {}
        for h in started_dirs:
            try:
                gathered[h.name] = gather_dir(tr, h, rdirs[h.name], out / "hosts" / h.name)
            except Exception as exc:  # noqa: BLE001 - gather what we can, say what we could not
                problems.append(f"gather {h.name}: {exc}")
            if not inv.run.keep_remote:
                try:
                    remove_dir(tr, h, rdirs[h.name])
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"remove {rdirs[h.name]} on {h.name}: {exc}")
        if lc is not None:
            try:
                (out / "loss_counters.json").write_text(json.dumps(lc.counters(), indent=1))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"loss counters: {exc}")
            lc.close()
    summary = collect_policy(inv, policy, out, problems, time.time() - t_begin)
    if failure is not None:
        raise failure
    return summary


def collect_policy(inv: Inventory, policy: str, out: Path, problems: list[str], wall_s: float) -> dict:
    """Place gathered files (records/, compute.csv, rounds.jsonl) and count what arrived."""
    from .records import read_records, write_records

    n_rounds = inv.rounds
    counts: dict[str, Any] = {}
    all_recs = []
    compute_rows: list[dict] = []
    srv_file = out / "hosts" / inv.server.name / "records.jsonl"
    if srv_file.exists():
        shutil.copyfile(srv_file, out / "records" / "server.jsonl")
        recs = list(read_records(srv_file))
        all_recs += recs
        per_w: dict[int, set] = {}
        for r in recs:
            per_w.setdefault(r.worker, set()).add(r.round)
        counts[inv.server.name] = {"role": "server", "records": len(recs),
                                   "rounds_per_worker": {str(k): len(v) for k, v in sorted(per_w.items())}}
        if len(recs) != n_rounds * len(inv.workers):
            problems.append(f"server {inv.server.name}: {len(recs)} records, expected {n_rounds * len(inv.workers)}")
    else:
        problems.append(f"server {inv.server.name}: no records gathered")
    ids = set()
    for h in inv.workers:
        f = out / "hosts" / h.name / "records.jsonl"
        if not f.exists():
            problems.append(f"worker {h.name}: no records gathered")
            continue
        recs = list(read_records(f))
        wid = recs[0].worker if recs else -1
        ids.add(wid)
        shutil.copyfile(f, out / "records" / f"worker{wid}.jsonl")
        all_recs += recs
        rounds = sorted({r.round for r in recs})
        counts[h.name] = {"role": "worker", "worker": wid, "records": len(recs), "rounds": len(rounds),
                          "device": recs[0].extra.get("device") if recs else None}
        if rounds != list(range(n_rounds)) or len(recs) != n_rounds:
            problems.append(f"worker {h.name}: {len(recs)} records over {len(rounds)} rounds, expected {n_rounds}")
        cf = out / "hosts" / h.name / "compute.csv"
        if cf.exists():
            with open(cf, newline="", encoding="utf-8") as fh:
                for row in csv.DictReader(fh):
                    compute_rows.append({"policy": policy, "host": h.name, **row})
        else:
            problems.append(f"worker {h.name}: no compute.csv")
    if len(ids) != len(inv.workers):
        problems.append(f"worker ids {sorted(ids)}: expected {len(inv.workers)} distinct ids")
    all_recs.sort(key=lambda r: (r.round, r.role, r.worker))
    if (out / "rounds.jsonl").exists():
        (out / "rounds.jsonl").unlink()
    write_records(out / "rounds.jsonl", all_recs)
    _write_compute(out / "compute.csv", compute_rows)
    (out / "config.json").write_text(json.dumps(policy_config(inv, policy, all_recs, out), indent=1) + "\n")
    s = {"policy": policy, "rounds": n_rounds, "workers": len(inv.workers), "hosts": counts,
         "problems": problems, "complete": not problems, "wall_s": wall_s}
    (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    return s


def policy_config(inv: Inventory, policy: str, recs: list, out_dir: Path | None = None) -> dict:
    """The run's settings under the names ``dblp.sim.calibrate`` looks up (its ``config.json``)."""
    chunks = max((r.chunks for r in recs), default=0)
    c: dict[str, Any] = {"policy_run": policy, "transport": inv.run.transport, "workers": len(inv.workers),
                         "iterations": inv.rounds, "seed": inv.run.seed, "eta": inv.run.eta, "freq": inv.run.freq,
                         "p_low": inv.run.p_low, "p_high": inv.run.p_high, "mode": inv.run.mode}
    if inv.run.mode == "synthetic":
        from .gradients import model_elements

        c["elements"] = model_elements(inv.run.model)
    else:
        for h in inv.workers:  # the trained model's parameter count, as the worker reported it
            dev = out_dir / "hosts" / h.name / "device.json" if out_dir else None
            if dev is not None and dev.exists():
                n = json.loads(dev.read_text()).get("parameters")
                if n:
                    c["elements"] = int(n)
                    break
        if "elements" not in c and chunks:
            c["chunks"] = chunks
        c["workload"] = inv.train.workload
    if inv.network.bandwidth:
        c["bw"] = _rate_bps(inv.network.bandwidth) / 1e6  # Mbit/s, as the Mininet scenarios write it
        c["buffer_pkts"] = inv.network.queue_packets
    if _rate_bps(inv.run.rate):
        c["send_rate_bps"] = _rate_bps(inv.run.rate)
    return c


COMPUTE_COLUMNS = ["policy", "host", "worker", "round", "compute_s", "exchange_s", "iteration_s", "device"]


def _write_compute(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, COMPUTE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def sim_compute_params(rows: list[dict], skip_first: int = 1) -> dict:
    """``compute_s`` (median) and ``compute_jitter_s`` (std) for :class:`dblp.sim.SimConfig`, from compute.csv rows.

    The first ``skip_first`` iterations of each worker are left out (CUDA
    context, cudnn autotuning, first-touch allocations)."""
    import numpy as np

    vals = np.array([float(r["compute_s"]) for r in rows
                     if r.get("compute_s") not in (None, "") and int(r.get("round", 0)) >= skip_first], float)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return {}
    devices = sorted({r.get("device", "") for r in rows if r.get("device")})
    return {"_source": "dblp.hosts: per-iteration compute time of the workers (compute.csv)",
            "_devices": devices, "_samples": int(vals.size), "_p90_s": float(np.percentile(vals, 90)),
            "compute_s": float(np.median(vals)), "compute_jitter_s": float(np.std(vals))}


def launch(inv: Inventory, results: str | os.PathLike = ROOT / "results",
           progress: Callable[[str], None] = print) -> Path:
    """Run every policy of the inventory and gather the results; returns the results folder.

    Raises :class:`HostsError` when a run fails or records are missing (the
    folder then holds what could be gathered and ``summary.json`` says what)."""
    out = _results_dir(Path(results), inv.run.name)
    if inv.path and Path(inv.path).exists():
        shutil.copyfile(inv.path, out / "inventory.toml")
    (out / "config.json").write_text(json.dumps({**inv.to_dict(), "rounds": inv.rounds, "plain": inv.plain,
                                                 "started": time.time(), "launcher_host": socket.gethostname()},
                                                indent=1) + "\n")
    run_id = f"{inv.run.name}-{_stamp()}-{os.getpid()}"
    summaries: dict[str, dict] = {}
    progress(f"hosts: {len(inv.workers)} workers + server over {inv.run.transport}, {inv.run.mode} "
             f"({inv.train.workload if inv.run.mode == 'train' else inv.run.model}), {inv.rounds} iterations, "
             f"policies {', '.join(inv.run.policies)}\n  results: {out}")
    old_term = None
    if threading.current_thread() is threading.main_thread():  # `kill PID` cleans up like Ctrl-C
        old_term = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    try:
        return _launch(inv, out, run_id, summaries, progress)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _sigterm_to_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _launch(inv: Inventory, out: Path, run_id: str, summaries: dict, progress: Callable[[str], None]) -> Path:
    failure: BaseException | None = None
    facts: dict[str, dict] = {}
    with make_transport(inv) as tr:
        facts = preflight(tr, inv)
        (out / "facts").mkdir()
        for name, f in facts.items():
            (out / "facts" / f"{name}.json").write_text(json.dumps(f, indent=1) + "\n")
        for policy in inv.run.policies:
            progress(f"- {policy}")
            try:
                summaries[policy] = run_policy(tr, inv, policy, out / policy, run_id, progress)
            except BaseException as exc:
                failure = exc
                s = json.loads((out / policy / "summary.json").read_text()) if (out / policy / "summary.json").exists() else {}
                summaries[policy] = {**s, "error": str(exc), "complete": False}
                break
    # devices, compute times for the simulator, overall summary
    devices = {}
    for name, f in facts.items():
        devices[name] = {"role": inv.host(name).role, "gpu": inv.host(name).gpu, "gpus": f.get("gpus", []),
                         "cpu": f.get("cpu", "")}
    rows: list[dict] = []
    for policy in summaries:
        cf = out / policy / "compute.csv"
        if cf.exists():
            with open(cf, newline="", encoding="utf-8") as fh:
                rows += list(csv.DictReader(fh))
        for h, c in summaries[policy].get("hosts", {}).items():
            if c.get("device"):
                devices[h]["device_used"] = c["device"]
    (out / "devices.json").write_text(json.dumps(devices, indent=1) + "\n")
    _write_compute(out / "compute.csv", rows)
    simc = sim_compute_params(rows)
    if simc:
        (out / "sim_compute.json").write_text(json.dumps(simc, indent=1) + "\n")
    total = {"policies": summaries, "complete": failure is None and all(s.get("complete") for s in summaries.values()),
             "transport": inv.run.transport}
    (out / "summary.json").write_text(json.dumps(total, indent=1) + "\n")
    if failure is not None:
        if isinstance(failure, KeyboardInterrupt):
            raise failure
        raise HostsError(f"{failure}\n  (partial results in {out})") from failure
    bad = {p: s["problems"] for p, s in summaries.items() if s.get("problems")}
    if bad:
        raise HostsError(f"records incomplete: {bad}\n  (results in {out})")
    return out


# ============================================================================ on the hosts
def host_facts(with_torch: bool = False) -> dict:
    """What a host is: name, python, CPU, GPUs (nvidia-smi; torch.cuda with ``with_torch``)."""
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

        f["dblp"] = str(Path(dblp.__file__).resolve().parent)
    except Exception:  # noqa: BLE001
        pass
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
    """The worker program on a host: a :class:`dblp.worker.Worker` replaying synthetic gradients or
    training a :mod:`dblp.train` workload; writes records.jsonl, compute.csv and device.json in ``--out``."""
    from .records import RecordWriter
    from .worker import Worker

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
            from .gradients import ReplayGradients, model_elements, synthetic_norms

            elements = model_elements(a.model)
            device = f"cpu ({_cpu_model()})"
            info.update(device=device, elements=elements)
            (out / "device.json").write_text(json.dumps(info, indent=1) + "\n")
            norms = synthetic_norms(max(a.rounds, 1), a.seed)
            with Worker(server_host, int(server_port), elements=elements, worker_id=rank,
                        send_rate_bps=_rate_bps(a.rate), peer_timeout=a.peer_timeout, source="hosts",
                        fast=False if a.plain else None) as wk:
                grads = ReplayGradients(elements, wk.worker_id, norms, a.seed)
                for k in range(a.rounds):
                    t0 = time.perf_counter()
                    if a.compute_ms:
                        time.sleep(a.compute_ms / 1000)
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

        from .train.exchange import AllreduceExchange
        from .train.loop import TrainConfig, iterations_per_epoch, resolve_device, train
        from .train.models import get_workload

        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
        else:
            device = resolve_device("cpu")
        wl = get_workload(a.workload, a.data_root or None, synthetic=a.synthetic_data, seed=a.seed)
        over: dict[str, Any] = dict(epochs=a.epochs, max_iters_per_epoch=a.iterations, rank=rank,
                                    world_size=a.world_size, device=str(device), out_dir=str(out / "train"),
                                    seed=a.seed, eval_max_batches=2)
        if a.batch_size:
            over["batch_size"] = a.batch_size
        if a.lr:
            over["lr"] = a.lr
        if a.threads:
            over["threads"] = a.threads
        cfg = TrainConfig.for_workload(wl, **over)
        iters = iterations_per_epoch(wl, cfg)
        if iters != a.iterations:
            raise SystemExit(f"dblp.hosts worker {rank}: only {iters} iterations of batch {cfg.batch_size} fit this "
                             f"worker's shard, the run needs train.iterations = {a.iterations} (lower it)")
        name = _device_name(device)
        n_params = sum(p.numel() for p in wl.model.parameters() if p.requires_grad)
        info.update(device=name, device_index=str(device), workload=wl.name, parameters=n_params,
                    cuda_available=torch.cuda.is_available(), torch=torch.__version__)
        (out / "device.json").write_text(json.dumps(info, indent=1) + "\n")
        with Worker(server_host, int(server_port), elements=n_params, worker_id=rank,
                    send_rate_bps=_rate_bps(a.rate), peer_timeout=a.peer_timeout, source="hosts",
                    fast=False if a.plain else None) as wk:
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


# ============================================================================ CLI
def describe(inv: Inventory) -> str:
    """The commands each host would run (addresses of netns/local hosts shown as <ip of NAME>)."""

    class _Dry(Transport):
        name = inv.run.transport

        def data_address(self, host: HostSpec) -> str:
            if inv.run.transport == "ssh":
                return host.data_address or host.address
            return "127.0.0.1" if inv.run.transport == "local" else f"<ip of {host.name}>"

    tr: Transport = SshTransport(inv) if inv.run.transport == "ssh" else _Dry(inv)
    srv = inv.server
    rdir = f"{inv.run.remote_dir.rstrip('/')}/<run>-<policy>-"
    lines = [f"transport {inv.run.transport}; {len(inv.workers)} workers; {inv.rounds} iterations; "
             f"policies {', '.join(inv.run.policies)}; mode {inv.run.mode}"]
    for policy in inv.run.policies:
        lines.append(f"[{policy}]")
        sa = server_argv(inv, policy, rdir + srv.name, tr.bind_address(srv), inv.run.port)
        lines.append(f"  {srv.name} (server): {shlex.join(tr.argv(srv, host_script(srv, rdir + srv.name, 'server', sa)))}"
                     if inv.run.transport == "ssh" else f"  {srv.name} (server): {shlex.join(sa)}")
        for wid, h in enumerate(inv.workers):
            wa = worker_argv(inv, h, wid, rdir + h.name, tr.data_address(srv), inv.run.port,
                             tr.data_address(inv.workers[0]))
            lines.append(f"  {h.name} (worker {wid}{', gpu' if h.gpu else ''}): "
                         + (shlex.join(tr.argv(h, host_script(h, rdir + h.name, 'worker', wa)))
                            if inv.run.transport == "ssh" else shlex.join(wa)))
    static, bursts = loss_targets(inv)
    for t, rate in static:
        lines.append(f"loss: {t.label()} {rate:.2%} for the whole run")
    for b in bursts:
        lines.append(f"loss: {', '.join(t.label() for t in b.targets)} {b.loss:.2%} at iteration {b.iteration} "
                     f"for {b.iterations}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dblp.hosts", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="validate an inventory and print the commands each host would run")
    c.add_argument("inventory")
    r = sub.add_parser("run", help="run the inventory's server and workers, gather the records")
    r.add_argument("inventory")
    r.add_argument("--results", default=str(ROOT / "results"), help="parent folder of the results folder")
    f = sub.add_parser("facts", help="(on a host) print this host's facts as JSON")
    f.add_argument("--torch", action="store_true", help="import torch for CUDA device names")
    w = sub.add_parser("worker", help="(on a host) the worker program the launcher starts")
    w.add_argument("--server", required=True, help="HOST:PORT")
    w.add_argument("--id", type=int, default=-1, help="worker id (default: $RANK under torchrun)")
    w.add_argument("--out", required=True, help="folder for records.jsonl, compute.csv, device.json")
    w.add_argument("--mode", choices=MODES, default="synthetic")
    w.add_argument("--rounds", type=int, default=100)
    w.add_argument("--model", default="1e6")
    w.add_argument("--compute-ms", type=float, default=0.0)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--rate", default="0")
    w.add_argument("--plain", action="store_true")
    w.add_argument("--peer-timeout", type=float, default=60.0)
    w.add_argument("--workload", default="small_cnn")
    w.add_argument("--epochs", type=int, default=1)
    w.add_argument("--iterations", type=int, default=20)
    w.add_argument("--world-size", type=int, default=1)
    w.add_argument("--batch-size", type=int, default=None)
    w.add_argument("--lr", type=float, default=None)
    w.add_argument("--threads", type=int, default=None)
    w.add_argument("--data-root", default="")
    w.add_argument("--synthetic-data", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "facts":
            print(json.dumps(host_facts(a.torch)))
            return 0
        if a.cmd == "worker":
            return worker_main(a)
        inv = load_inventory(a.inventory)
        if a.cmd == "check":
            print(describe(inv))
            return 0
        out = launch(inv, a.results)
        print(f"hosts: done; results in {out}")
        return 0
    except (InventoryError, HostsError) as exc:
        print(f"dblp.hosts: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dblp.hosts: interrupted; processes ended, remote folders removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
