"""What runs leave behind, read back: tables and plots of per-round records, replicate
statistics, time to accuracy and the answer table over seeds, training reports, performance
targets, the critical-regime view, loss exposure, the pass-cost model and capture import.

It only reads records and files; it may import protocol, transport, runs and cli, never
train or sim.
"""
