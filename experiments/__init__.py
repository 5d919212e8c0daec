"""What runs psrv for a user: the launcher (`psrv run`, launcher/), the comparison harness (`psrv experiment`,
harness/), the benchmarks (`make bench`, bench/) and the simulator (`psrv simulate`, simulate/); specs/ holds
the shipped specs."""
