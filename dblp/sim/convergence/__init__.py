"""Time to accuracy in the simulator: the accuracy curve and walk the convergence models share,
the models (per gradient-norm regime, per loss-compensation mode) and the training runs they are
fitted to (``data/``).

It may import the simulator's own modules (config, model, plots), its network and engines, and
:mod:`dblp.train`, :mod:`dblp.results` and below; never :mod:`dblp.sim.studies`.
"""
