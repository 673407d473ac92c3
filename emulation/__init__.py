"""Mininet emulation of the DBLP testbed on kernels without netem or Open vSwitch.

Public entry points (see each module's docstring for why it is built this way):

- ``emulation.net.EmuNet``: start a Topo on Linux bridges, TBF-shaped links,
  guaranteed teardown (context manager, signal handlers, state file);
- ``emulation.loss.LossController`` / ``LossTarget``: nftables random drop on a
  host link end, changed atomically while the run goes on;
- ``emulation.bursts.BurstInjector`` and burst kinds: scripted microbursts,
  random and congestion (cross-traffic) bursts, logged as JSONL;
- ``emulation.launch.run_with_bursts``: one policy's run on a star with a
  burst schedule, started by ``dblp.runs.launch.Launch`` (a server and its workers
  on local, namespace, Mininet or ssh hosts) and clocked by
  ``dblp.transport.watch.RoundWatcher``;
- ``emulation.nft`` / ``emulation.shaping``: the only writers of nft rule
  text and of tc commands;
- ``emulation.hosts``: the real-host launcher (``python -m emulation.hosts``);
- ``emulation.recorder.RunRecorder``: one results folder per run;
- ``python -m emulation.cleanup``: remove leftovers of a killed run;
- ``emulation.netem.has_netem``: probe the kernel for netem.

Importing this package does not import Mininet; the submodules that need it do.
"""
