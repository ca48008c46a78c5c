"""The `paramshard` command. Each subcommand lives in paramshard/cli/<name>.py
and exposes HELP, add_arguments(parser) and run(args) -> exit code, and
optionally EXAMPLE, a command line or a tuple of them (shown at the end of its --help)."""
from __future__ import annotations

import argparse
import importlib
import sys

from paramshard.errors import ParamshardError

# subcommand -> module under paramshard.cli (jobs/: a job's life; data/: a user's data; models/: a trained model)
COMMANDS = {
    "plan": "jobs.plan",
    "launch": "jobs.launch",
    "run": "jobs.run",
    "server": "jobs.server",
    "env": "jobs.env",
    "split-data": "data.split_data",
    "gen-data": "data.gen_data",
    "dataset": "data.dataset",
    "schema": "data.schema",
    "replay": "data.replay",
    "stats": "jobs.stats",
    "scale": "jobs.scale",
    "export": "models.export",
    "export-model": "models.export_model",
    "predict": "models.predict",
    "serve": "models.serve",
    "k8s": "jobs.k8s",
    "report": "jobs.report",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the example's line breaks and adds "(default: X)" to an option whose
    help does not state its default already (options without a value are left alone)."""

    def _get_help_string(self, action):
        help = action.help or ""
        if (not action.option_strings or "default" in help or "%(default)" in help
                or action.default in (None, False, True, [], "", argparse.SUPPRESS)):
            return help
        return help + " (default: %(default)s)"


def _epilog(example: str | tuple[str, ...]) -> str | None:
    examples = (example,) if isinstance(example, str) else tuple(example)
    if not examples:
        return None
    return ("example:\n  " if len(examples) == 1 else "examples:\n  ") + "\n  ".join(examples)


def _version() -> str:
    from paramshard import __version__
    return __version__


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` just that subcommand: a server or a rank
    started as `paramshard server` then imports no other subcommand's modules (the data
    commands load pandas and pyarrow: ~0.5 s of CPU in every process of every job)."""
    parser = argparse.ArgumentParser(prog="paramshard", description="Parameter-server training for PyTorch.")
    parser.add_argument("--version", action="version", version=f"paramshard {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(f"paramshard.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"paramshard.cli.{module_name}":
                raise
            continue  # not built yet
        p = sub.add_parser(name, help=module.HELP, description=module.HELP, formatter_class=HelpFormatter,
                           epilog=_epilog(getattr(module, "EXAMPLE", ())))
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    if argv and argv[0] in COMMANDS:
        # A subcommand may rewrite its own arguments before argparse sees them (PREPROCESS).
        module = importlib.import_module(f"paramshard.cli.{COMMANDS[argv[0]]}")
        argv = [argv[0], *getattr(module, "preprocess", lambda a: a)(argv[1:])]
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
