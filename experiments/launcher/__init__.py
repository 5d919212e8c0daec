"""The launcher: what `psrv run` does to start, place, watch, kill and restart a run's processes (locally, in
network namespaces, under SLURM, torchrun or Kubernetes), the faults it injects (nemesis), the run folder and
summary.json it writes, and the history it checks (`psrv check`) and measures goodput from."""
