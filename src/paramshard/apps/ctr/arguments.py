"""The CTR app's arguments checked without training: what `paramshard launch -m
paramshard.apps.ctr ARGS` runs before it starts any process (launch/rank/app_check.py),
so a misspelt model or a missing --schema is refused in a second, once, rather than by
every trainer after the whole cluster started.

The same parser and resolve() as the run (options.py), then, with ``files``, what every
trainer checks first (inputs.py): the schema reads, and every input file exists and has
the columns it needs."""
from __future__ import annotations

from paramshard.errors import ConfigError


def check_arguments(argv: list[str], files: bool = True, description: str = "") -> None:
    from paramshard.apps.ctr.inputs import checked_schema
    from paramshard.apps.ctr.options import parser, resolve

    p = parser(description)

    def refuse(message: str):
        # argparse's own message, without its usage block: one line, the launcher adds the rest.
        raise ConfigError(f"{message} (`python -m paramshard.apps.ctr --help` lists its options)")
    p.error = refuse        # type: ignore[method-assign]  # this parser only: argparse calls self.error
    args = resolve(p.parse_args(argv))
    from paramshard.apps.ctr import refit
    refit.refuse_launched(args)       # only the launcher calls this: a launched job cannot refit
    if files and args.stream:
        from paramshard.apps.ctr.stream.options import checked_schema as stream_schema
        stream_schema(args)         # fitted, binary: the stream has no files to check
    elif files:
        from paramshard.apps.ctr.selection import settle_monitor
        settle_monitor(args, checked_schema(args))     # the trainers' own first check (one trainer's share of rows)
