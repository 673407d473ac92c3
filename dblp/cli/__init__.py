"""The command line: the one flag vocabulary (:mod:`dblp.cli.args`), config files, progress
lines, what a run records of itself (provenance) and ``python -m dblp server|worker|loopback``
(:mod:`dblp.cli.commands`).

It may import protocol, transport and runs. One call reaches above it: ``--workload``'s check
(:func:`dblp.cli.args.check_workload_args`) loads the workload from :mod:`dblp.train` when it
runs, since the training extra (PyTorch) is optional and the flag is checked before anything
starts.
"""
