from __future__ import annotations

from ..env import ClusterEnv
from ..errors import ConfigError
from ..log import configure
from ..runtime import serve

HELP = "run one parameter server, configured by the environment contract (see `paramshard env`)"
EXAMPLE = ("PARAMSHARD_ROLE=server PARAMSHARD_SERVERS=10.0.0.1:6174,10.0.0.2:6174 PARAMSHARD_SERVER_ID=0 \\\n"
           "    PARAMSHARD_TRAINERS=2 paramshard server")


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    env = ClusterEnv.from_environ()
    if env.role != "server":
        raise ConfigError("PARAMSHARD_ROLE must be 'server' (with PARAMSHARD_SERVERS and "
                          "PARAMSHARD_SERVER_ID); `paramshard env` lists the variables")
    configure(env.log_tag)
    return serve(env)
