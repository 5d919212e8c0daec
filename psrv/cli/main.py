"""`psrv`: the parser of every command, the logging of one process, and the one-line answer to bad input."""
from __future__ import annotations

import argparse
import logging
import sys

from psrv.cli import admin, check, experiment, keygen, run, serve, simulate, top, worker
from psrv.config.cli_args import PREFIX, read_config_file

EPILOG = "Docs: README.md (quick start), docs/usage.md (every command), docs/scripts.md, docs/experiments.md."
COMMANDS = {"serve": serve, "worker": worker, "keygen": keygen, "admin": admin, "run": run, "experiment": experiment,
            "simulate": simulate, "top": top, "check": check}  # in the order --help lists them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="psrv", description="Parameter-server training with sync, async "
                                     "and SSP consistency, and a harness that compares them with DDP.",
                                     epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        module.add(sub)
    return parser


def _role(a: argparse.Namespace) -> str:
    """'server K' or 'worker R' for the log lines of one process; the command's name otherwise."""
    key = {"serve": ("server", "shard"), "worker": ("worker", "rank")}.get(a.command)
    if key is None:
        return a.command
    index = vars(a).get(f"{PREFIX}{key[1]}")
    if index is None and a.config:
        try:
            index = read_config_file(a.config).get(key[1])
        except ValueError:  # said once more, as an error, when the config is built
            pass
    return f"{key[0]} {index if index is not None else 0}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    role = _role(args)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command].command(args)
    except ValueError as exc:  # bad input: say what to change, no traceback
        logging.getLogger("psrv").debug("the error's traceback:", exc_info=True)  # shown with --log-level DEBUG
        print(f"psrv {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        # PSError's module (the client's and the admin client's round trips) is imported, with torch, only
        # by the commands that talk to servers
        roundtrip = sys.modules.get("psrv.client.roundtrip")
        if isinstance(exc, TimeoutError) or (roundtrip is not None and isinstance(exc, roundtrip.PSError)):
            print(f"psrv {args.command}: {exc}", file=sys.stderr)  # a server refused us or never answered
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
