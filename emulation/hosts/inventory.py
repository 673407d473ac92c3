"""The host inventory: a TOML file naming one server and N worker machines, checked field by field.

Why a module of its own: the inventory is read on the launching machine
(``check``/``run``) and nowhere else, and every error must name the file and
the field (``hosts[2].loss[0].at``) before anything is started. Loss rules
use the project's one loss-process vocabulary (:mod:`traces.processes`:
``kind = "bernoulli"``, ``"iteration_bursts"``, ``"random_bursts"``), placed
on a host's link end by ``direction``/``proto``/``dports``/``intf``; the
format is documented in ``docs/hosts.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dblp.cli.args import pace_arg
from dblp.protocol.control import DEFAULT_PORT
from dblp.protocol.policy import RUNS, run_policy
from dblp.protocol.wire import ParameterError
from traces.argtypes import check_host
from traces.processes import NFT_KINDS, LossSpecError, burst_iterations, burst_windows, check_spec, undeliverable
from traces.units import parse_rate

ROOT = Path(__file__).resolve().parents[2]
TRANSPORTS = ("ssh", "netns", "local")
ROLES = ("server", "worker")
#: the DBLP server's policies (:mod:`dblp.protocol.policy`: the one list of run names)
DBLP_POLICIES = RUNS
#: the same training with torch's own all-reduce (``torch.distributed``, no DBLP server): the yardstick
TORCH_POLICIES = ("gloo", "nccl")
POLICIES = DBLP_POLICIES + TORCH_POLICIES
MODES = ("synthetic", "train")
LAUNCHERS = ("torchrun", "python")
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$")
#: keys of a ``[[hosts.loss]]`` table that place the rule; the others are the loss spec
PLACEMENT_KEYS = ("direction", "proto", "dports", "intf")


class InventoryError(ValueError):
    """A bad inventory: the message names the file and the field (``hosts[2].role``)."""


class HostsError(RuntimeError):
    """A run failed: a host unreachable, a process failed, records missing."""



@dataclass
class LossRule:
    """A loss process on one host's link end, realised with an nftables drop rule.

    ``spec``: a :mod:`traces.processes` spec of a kind in
    :data:`~traces.processes.NFT_KINDS`: ``bernoulli`` (``p`` for the whole
    run), ``iteration_bursts`` (``at``, ``loss``, ``length``) or
    ``random_bursts`` (``rate``, ``loss``, ``length``, drawn from the run's
    seed); the iteration-keyed ones are switched on and off as the server's
    records show the iterations start. The other fields place the rule (see
    :class:`emulation.loss.LossTarget`).
    """

    spec: dict[str, Any]
    direction: str = "ingress"  # ingress | egress
    proto: str = "udp"  # udp | all
    dports: list[int] | None = None  # [lo, hi]
    intf: str | None = None  # default: the host's intf

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
    port: int = DEFAULT_PORT
    rate: str = "auto"  # sender pacing: auto (self-pacing), 0 (unpaced) or a rate (an override)
    plain: bool | None = None  # None: True when any loss rule exists
    insecure: bool = False  # the paper's unauthenticated wire; else a secret per run in every host's $DBLP_SECRET
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
    eval_batches: int = 0  # test batches per evaluation; 0 = the whole test set

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
    def insecure(self) -> bool:
        return self.run.insecure

    @property
    def plain(self) -> bool:
        if self.run.plain is not None:
            return self.run.plain
        return any(h.loss for h in self.hosts)

    def to_dict(self) -> dict:
        return {"run": asdict(self.run), "network": asdict(self.network), "train": asdict(self.train),
                "hosts": [asdict(h) for h in self.hosts], "path": self.path}


    def loss_schedule(self) -> tuple[list[tuple[HostSpec, LossRule, float]],
                                     list[tuple[HostSpec, LossRule, int, int, float]]]:
        """The inventory's loss rules expanded: (static [(host, rule, p)],
        bursts [(host, rule, first iteration, iterations, loss)]).

        Rule ``i`` (in host order, then rule order) draws its random bursts
        from stream ``i`` of the run's seed, as the simulator's spec ``i`` does.
        """
        static, bursts = [], []
        i = 0
        for h in self.hosts:
            for r in h.loss:
                if r.spec["kind"] == "bernoulli":
                    static.append((h, r, float(r.spec["p"])))
                else:
                    for k, n, loss in burst_windows(burst_iterations(r.spec, i, self.run.seed, self.rounds)):
                        bursts.append((h, r, k, n, loss))
                i += 1
        return static, bursts

    def burst_starts(self) -> list[int]:
        """First iterations of every loss burst of the run (for reports)."""
        return sorted({k for _, _, k, _, _ in self.loss_schedule()[1]})


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
    if not isinstance(d, dict):
        raise _err(src, where, "expected a table")
    if "kind" not in d and ({"rate", "rounds"} & set(d)):
        raise _err(src, where, "'rate'/'rounds' are the old form: write kind = 'bernoulli', p = RATE (whole run), "
                               "or kind = 'iteration_bursts', at = [ITERATIONS], loss = RATE, length = N")
    if "kind" not in d:
        raise _err(src, f"{where}.kind", f"required: one of {', '.join(NFT_KINDS)} (traces.processes vocabulary)")
    spec = {k: v for k, v in d.items() if k not in PLACEMENT_KEYS}
    if "dirs" in spec:
        raise _err(src, f"{where}.dirs", "on a host the link end is given by direction = 'ingress' | 'egress'")
    try:
        check_spec(spec)
        why = undeliverable(spec)
    except LossSpecError as exc:
        raise _err(src, f"{where}.{exc.param}" if exc.param else where, str(exc)) from None
    if why:
        raise _err(src, where, why)
    if spec["kind"] not in NFT_KINDS:
        raise _err(src, f"{where}.kind", f"{spec['kind']!r} cannot be realised by a drop rule switched at iteration "
                                         f"starts; use one of {', '.join(NFT_KINDS)}")
    place = _fill(LossRule, {k: v for k, v in d.items() if k in PLACEMENT_KEYS}, src, where, skip=("spec",))
    rule = LossRule(spec=spec, **place)
    if rule.direction not in ("ingress", "egress"):
        raise _err(src, f"{where}.direction", f"must be 'ingress' or 'egress', got {rule.direction!r}")
    if rule.proto not in ("udp", "all"):
        raise _err(src, f"{where}.proto", f"must be 'udp' or 'all', got {rule.proto!r}")
    if rule.dports is not None:
        if rule.proto != "udp":
            raise _err(src, f"{where}.dports", "only with proto = 'udp'")
        if len(rule.dports) != 2 or not 0 < rule.dports[0] <= rule.dports[1] < 65536:
            raise _err(src, f"{where}.dports", f"expected [lo, hi] with 0 < lo <= hi < 65536, got {rule.dports}")
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
        raise _err(src, "run.policies", f"give at least one of {', '.join(POLICIES)}")
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
    for i, p in enumerate(run.policies):
        if p in TORCH_POLICIES and run.mode != "train":
            raise _err(src, f"run.policies[{i}]", f"{p!r} trains with torch's own all-reduce: it needs mode = 'train'")
    try:  # the policy objects' own checks (tolerances in [0, 1), P_high >= P_low, eta, freq)
        for p in (p for p in run.policies if p in DBLP_POLICIES):
            run_policy(p, run.p_low, run.p_high, run.eta, run.freq)
    except (ParameterError, TypeError) as exc:
        field_ = next((f for f in ("p_high", "p_low", "eta", "freq") if f in str(exc)), "p_low")
        raise _err(src, f"run.{field_}", str(exc)) from None
    try:
        from dblp.runs.gradients import model_elements

        model_elements(run.model)
    except Exception as exc:  # noqa: BLE001
        raise _err(src, "run.model", str(exc)) from None
    try:
        pace_arg(run.rate)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise _err(src, "run.rate", str(exc)) from None
    if not run.remote_dir.startswith("/") or run.remote_dir.rstrip("/") in ("", "/tmp", "/home", "/root"):
        raise _err(src, "run.remote_dir", f"must be an absolute folder of its own (runs make subfolders), got {run.remote_dir!r}")

    network = NetworkSpec(**_fill(NetworkSpec, data.get("network", {}), src, "network"))
    if network.bandwidth:
        try:
            if parse_rate(network.bandwidth) <= 0:
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
    if train.eval_batches < 0:
        raise _err(src, "train.eval_batches", f"must be >= 0 (0 = the whole test set), got {train.eval_batches}")
    if train.batch_size is not None and train.batch_size < 1:
        raise _err(src, "train.batch_size", f"must be >= 1, got {train.batch_size}")

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
        for key in ("address", "data_address"):
            addr = getattr(h, key)
            if addr:
                try:
                    check_host(addr.rpartition("@")[2])  # an ssh target may be user@host
                except ValueError as exc:
                    raise _err(src, f"{where}.{key}", str(exc)) from None
        if not 0 < h.ssh_port < 65536:
            raise _err(src, f"{where}.ssh_port", f"must be a TCP port, got {h.ssh_port}")
        n_rounds = train.rounds if run.mode == "train" else run.rounds
        for j, r in enumerate(h.loss):
            at = r.spec.get("at", [])
            at = [at] if isinstance(at, int) else at
            if at and max(at) >= n_rounds:
                raise _err(src, f"{where}.loss[{j}].at", f"iterations must lie below the run's {n_rounds}, got {at}")
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
    if run.mode == "train":
        _check_train(train, len(hosts) - 1, src)
    return Inventory(run=run, network=network, train=train, hosts=hosts, path=src)


def _check_train(train: TrainSpec, workers: int, src: str) -> None:
    """The workload exists and every worker's shard holds ``iterations`` batches per epoch.

    Checked here, before any host starts, where torch is installed (the
    launching machine may have none); the agent checks again on each host.
    Synthetic data is sized by the agent to fit the run; WikiText-2's size
    depends on the data and is checked on the hosts only.
    """
    from importlib.util import find_spec

    if find_spec("torch") is None:
        return
    try:
        from dblp.train.loop import epoch_iterations  # noqa: PLC0415
        from dblp.train.models import WORKLOAD_DEFAULTS, train_samples, workload_key  # noqa: PLC0415
    except ImportError:
        return
    try:
        key = workload_key(train.workload)
    except KeyError as exc:
        raise _err(src, "train.workload", str(exc.args[0])) from None
    if train.synthetic_data:
        return
    samples = train_samples(key)
    if samples is None:
        return
    batch = train.batch_size or int(WORKLOAD_DEFAULTS[key]["batch_size"])
    fit = epoch_iterations(samples, batch, workers)
    if train.iterations > fit:
        raise _err(src, "train.iterations",
                   f"{train.iterations} iterations per epoch do not fit: {key}'s {samples} training samples "
                   f"split over {workers} workers give each {samples // workers}, i.e. {fit} batches of "
                   f"{batch} per epoch; set iterations <= {fit} or a smaller batch_size (rounds = epochs x iterations: "
                   "raise epochs for a longer run)")


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

