"""The command line, `psrv COMMAND`: one module per command (serve, worker, keygen, admin, run, experiment,
simulate, top, check), each adding its options and parsing them into the config tree, then calling one layer
down. It is the top layer: nothing imports it (pyproject.toml's import contracts)."""
from psrv.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
