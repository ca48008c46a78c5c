"""The `paramshard` command. Each subcommand lives in paramshard/cli/<name>.py
and exposes HELP, add_arguments(parser) and run(args) -> exit code."""
from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import ParamshardError

# subcommand -> module under paramshard.cli
COMMANDS = {
    "plan": "plan",
    "launch": "launch",
    "server": "server",
    "env": "env",
    "split-data": "split_data",
    "gen-data": "gen_data",
    "export": "export",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paramshard", description="Parameter-server training for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(f"paramshard.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"paramshard.cli.{module_name}":
                raise
            continue  # not built yet
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except ParamshardError as exc:
        print(f"paramshard {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
