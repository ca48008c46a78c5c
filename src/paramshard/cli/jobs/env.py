from __future__ import annotations

from paramshard.env import ClusterEnv, engine_variables_markdown, variables_markdown
from paramshard.settings.docs import environment_markdown

HELP = "print the environment contract (all variables) or this process's reading of it"
EXAMPLE = "PARAMSHARD_ROLE=trainer PARAMSHARD_SERVERS=10.0.0.1:6174 paramshard env --show"


def add_arguments(p):
    p.add_argument("--show", action="store_true", help="print how this environment is read")
    p.add_argument("--markdown", action="store_true",
                   help="print docs/environment.md, generated from the settings' table")


def run(args) -> int:
    if args.show:
        print(ClusterEnv.from_environ())
    elif args.markdown:
        print(environment_markdown(), end="")
    else:
        print(variables_markdown())
        print("\nRead from each engine by `paramshard run`:\n")
        print(engine_variables_markdown())
    return 0
