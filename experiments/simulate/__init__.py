"""`psrv simulate`: a discrete-event simulation of N workers and S shards driven by psrv's own
consistency controllers and update rules (docs/simulator.md).

`experiments.simulate.run.simulate(cfg, out=DIR)` runs one SimulationConfig (experiments/simulate/config.py)
and writes what a real run writes, marked simulated; `experiments.simulate.calibrate` runs a real run
beside its simulation and compares them. Importing this package imports neither torch nor numpy.
"""
