from __future__ import annotations

import dataclasses

from paramshard.budgets import parse_budget
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.log import configure, get_logger
from paramshard.runtime import serve
from paramshard.settings.argtypes import flag_error
from paramshard.transport.security import Security

log = get_logger("server")

HELP = "run one parameter server, configured by the environment contract (see `paramshard env`)"
EXAMPLE = ("PARAMSHARD_ROLE=server PARAMSHARD_SERVERS=10.0.0.1:6174,10.0.0.2:6174 PARAMSHARD_SERVER_ID=0 \\\n"
           "    PARAMSHARD_TRAINERS=2 paramshard server")


def add_arguments(p) -> None:
    p.add_argument("--memory-budget", metavar="SIZE", default=None,
                   help="RAM this server may hold, like 4GB, 512MiB or bytes: sparse rows past it live in a file "
                        "tier under the run or checkpoint directory (default: PARAMSHARD_MEMORY_BUDGET, else "
                        "every row in RAM)")
    p.add_argument("--idle-exit", metavar="SECONDS", default=None,
                   type=_idle_seconds,
                   help="exit (code 1, naming what it waited for) when nothing of its job (a trainer, a launcher's "
                        "move, a restore) has reached this server this long after its start or its last hello (default: PARAMSHARD_IDLE_EXIT, "
                        "else PARAMSHARD_TIMEOUT but at least 60; 0: wait for ever)")


def _idle_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise flag_error(f"--idle-exit {text}: not a number of seconds") from None
    if not value >= 0:
        raise flag_error(f"--idle-exit {text}: must be >= 0 seconds (0: wait for ever)")
    return value


def run(args) -> int:
    budget = None
    if getattr(args, "memory_budget", None) is not None:
        budget = parse_budget(args.memory_budget, "--memory-budget")      # a bad size fails here, named as typed
    env = ClusterEnv.from_environ()
    if budget is not None:
        env = dataclasses.replace(env, memory_budget=budget)
    if getattr(args, "idle_exit", None) is not None:
        env = dataclasses.replace(env, idle_exit=args.idle_exit)
    if env.role != "server":
        raise ConfigError("PARAMSHARD_ROLE must be 'server' (with PARAMSHARD_SERVERS and "
                          "PARAMSHARD_SERVER_ID); `paramshard env` lists the variables")
    configure(env.log_tag)
    if Security.from_env(env) is None:
        warn_unauthenticated(env)
    return serve(env)


def warn_unauthenticated(env: ClusterEnv) -> None:
    """A server without keys takes any request from anyone who reaches its port: say so, loudly."""
    if env.insecure:        # asked for by name (launch --insecure, PARAMSHARD_INSECURE=1): one line
        log.warning("server %s: UNAUTHENTICATED plain TCP (PARAMSHARD_INSECURE=1): anyone who reaches its port "
                    "can read and change the model", env.server_id)
        return
    log.warning("server %s: WARNING: no PARAMSHARD_SECRET (or PARAMSHARD_KEYS_DIR) is set, so this server is "
                "UNAUTHENTICATED plain TCP: anyone who can reach its port can read the model's parameters, "
                "overwrite them, stop the server or make it hold memory, and its traffic is not encrypted. Set "
                "the same PARAMSHARD_SECRET (e.g. `export PARAMSHARD_SECRET=$(openssl rand -hex 32)`) and "
                "PARAMSHARD_JOB_ID on every server and trainer of the job (docs/security.md), or "
                "PARAMSHARD_INSECURE=1 to say plain TCP is meant (a network no one else reaches)", env.server_id)
