from __future__ import annotations

import dataclasses

from ..budgets import parse_budget
from ..env import ClusterEnv
from ..errors import ConfigError
from ..log import configure
from ..runtime import serve

HELP = "run one parameter server, configured by the environment contract (see `paramshard env`)"
EXAMPLE = ("PARAMSHARD_ROLE=server PARAMSHARD_SERVERS=10.0.0.1:6174,10.0.0.2:6174 PARAMSHARD_SERVER_ID=0 \\\n"
           "    PARAMSHARD_TRAINERS=2 paramshard server")


def add_arguments(p) -> None:
    p.add_argument("--memory-budget", metavar="SIZE", default=None,
                   help="RAM this server may hold, like 4GB, 512MiB or bytes: sparse rows past it live in a file "
                        "tier under the run or checkpoint directory (default: PARAMSHARD_MEMORY_BUDGET, else "
                        "every row in RAM)")


def run(args) -> int:
    budget = None
    if getattr(args, "memory_budget", None) is not None:
        budget = parse_budget(args.memory_budget, "--memory-budget")      # a bad size fails here, named as typed
    env = ClusterEnv.from_environ()
    if budget is not None:
        env = dataclasses.replace(env, memory_budget=budget)
    if env.role != "server":
        raise ConfigError("PARAMSHARD_ROLE must be 'server' (with PARAMSHARD_SERVERS and "
                          "PARAMSHARD_SERVER_ID); `paramshard env` lists the variables")
    configure(env.log_tag)
    return serve(env)
