"""Run the real DBLP server and workers on the machines of an inventory file.

    python -m emulation.hosts check hosts.toml   # validate, print the commands each host would run
    python -m emulation.hosts run hosts.toml     # run, gather every host's records into results/
    python scenarios/gpu_hosts.py hosts.toml     # the same, plus the cross-check against the simulator

The inventory (TOML, documented in ``docs/hosts.md``) names one server and
N worker hosts: addresses, ssh user, python path, checkout folder, GPU or not,
and optional loss rules (the loss-process vocabulary of
:mod:`traces.processes`, realised with nftables). Nothing here is a cluster manager: hosts are
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
its records (``records.jsonl``, :class:`dblp.protocol.records.RoundRecord` rows with
``source="hosts"``), and on workers ``compute.csv`` and ``device.json``. The
launcher streams each process's output into a local log, applies loss rules
(static, or iteration-keyed bursts switched by the server's round hook), waits for
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
        <policy>/hook.jsonl             the server's round-hook calls (bursts switched before their round)
        devices.json                    host -> device name(s) used
        compute.csv                     all policies' compute times
        sim_compute.json                compute_s / compute_jitter_s for dblp.sim (SimConfig keys)
        summary.json                    record counts per host and round, problems found

The package, by concern: :mod:`.inventory` (the TOML file, checked by
field), :mod:`.transport` (ssh / netns / local), :mod:`.commands` (the
command lines), :mod:`.keep` (one kept agent per host with loss rules:
commands, and the server's round hook relayed, so bursts switch before the
round they name), :mod:`.rules` (nft loss rules through the kept agents),
:mod:`.procs` (programs watched through pid files), :mod:`.gather` (``tar``
back, records placed and counted), :mod:`.launcher` (preflight and runs),
:mod:`.agent` (the program on the hosts), :mod:`.cli`. It sits in
``emulation`` because it uses the emulation's loss controller, burst
injector, namespace hosts, launcher interface and round watcher, and
``dblp`` imports nothing above itself.

Cleanup: every process is ended (local client first, then the remote pid
from its pid file), every remote folder and nft table this run made is
removed, on success, failure and Ctrl-C alike; namespaces of the netns
transport go with :class:`NsNet` (``python -m emulation.nshosts --cleanup``
after a ``kill -9``).
"""

from __future__ import annotations

from .agent import host_facts, worker_main
from .cli import build_parser, describe, main
from .commands import host_script, policy_args, server_argv, worker_argv
from .gather import collect_policy, gather_dir, policy_config, remove_dir, sim_compute_params
from .inventory import (DBLP_POLICIES, TORCH_POLICIES, HostSpec, HostsError, Inventory, InventoryError, LossRule,
                        NetworkSpec, RunSpec, TrainSpec, load_inventory, parse_inventory)
from .keep import KeptHost, hook_delays
from .launcher import launch, preflight, run_policy
from .procs import HostProc
from .rules import NFT_TABLE, HostsNet, loss_controller, loss_targets
from .transport import LocalTransport, NetnsTransport, SshTransport, Transport, make_transport

__all__ = ["DBLP_POLICIES", "KeptHost", "TORCH_POLICIES", "hook_delays", "HostProc", "HostSpec", "HostsError", "HostsNet", "Inventory", "InventoryError", "LocalTransport",
           "LossRule", "NFT_TABLE", "NetnsTransport", "NetworkSpec", "RunSpec", "SshTransport", "TrainSpec",
           "Transport", "build_parser", "collect_policy", "describe", "gather_dir", "host_facts", "host_script",
           "launch", "load_inventory", "loss_controller", "loss_targets", "main", "make_transport",
           "parse_inventory", "policy_args", "policy_config", "preflight", "remove_dir", "run_policy",
           "server_argv", "sim_compute_params", "worker_argv", "worker_main"]
