import pytest

from paramshard.env import ClusterEnv, variables_markdown
from paramshard.errors import ConfigError


def test_paramshard_names():
    env = ClusterEnv.from_environ({
        "PARAMSHARD_ROLE": "trainer", "PARAMSHARD_SERVERS": "h1:1,h2:2", "PARAMSHARD_TRAINERS": "3",
        "PARAMSHARD_TRAINER_ID": "2", "PARAMSHARD_MODE": "async", "PARAMSHARD_DISPATCH": "balanced"})
    assert (env.role, env.servers, env.num_trainers, env.trainer_id, env.mode, env.dispatch) == \
        ("trainer", ("h1:1", "h2:2"), 3, 2, "async", "balanced")


def test_round_trip_through_environ():
    env = ClusterEnv(role="server", servers=("a:1", "b:2"), server_id=1, num_trainers=4, mode="async",
                     timeout=7.5, min_block_size=100)
    assert ClusterEnv.from_environ(env.to_environ()) == env


def test_paddle_fallbacks():
    env = ClusterEnv.from_environ({
        "PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1:6174,10.0.0.2:6174",
        "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6174", "PADDLE_TRAINERS_NUM": "2"})
    assert (env.role, env.server_id, env.num_trainers) == ("server", 1, 2)
    env = ClusterEnv.from_environ({
        "TRAINING_ROLE": "TRAINER", "PADDLE_INIT_PSERVERS": "h1,h2", "PADDLE_INIT_PORT": "7164",
        "PADDLE_INIT_NUM_GRADIENT_SERVERS": "3", "PADDLE_INIT_TRAINER_ID": "1"})
    assert (env.role, env.servers, env.num_trainers, env.trainer_id) == ("trainer", ("h1:7164", "h2:7164"), 3, 1)


def test_paramshard_names_win_over_paddle_names():
    env = ClusterEnv.from_environ({"PARAMSHARD_ROLE": "trainer", "PADDLE_TRAINING_ROLE": "PSERVER",
                                   "PARAMSHARD_SERVERS": "a:1"})
    assert env.role == "trainer"


def test_openmpi_ranks_split_into_servers_then_trainers():
    base = {"PARAMSHARD_SERVERS": "a:1,b:2", "OMPI_COMM_WORLD_SIZE": "5"}
    assert ClusterEnv.from_environ({**base, "OMPI_COMM_WORLD_RANK": "1"}).server_id == 1
    env = ClusterEnv.from_environ({**base, "OMPI_COMM_WORLD_RANK": "4"})
    assert (env.role, env.trainer_id, env.num_trainers) == ("trainer", 2, 3)
    with pytest.raises(ConfigError, match="leaves no trainer"):
        ClusterEnv.from_environ({**base, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"})


@pytest.mark.parametrize("environ,message", [
    ({"PARAMSHARD_ROLE": "boss"}, "expected server or trainer"),
    ({"PARAMSHARD_ROLE": "trainer"}, "needs PARAMSHARD_SERVERS"),
    ({"PARAMSHARD_ROLE": "trainer", "PARAMSHARD_SERVERS": "nohost"}, "is not host:port"),
    ({"PARAMSHARD_ROLE": "trainer", "PARAMSHARD_SERVERS": "a:1", "PARAMSHARD_TRAINER_ID": "x"}, "not a whole number"),
    ({"PARAMSHARD_ROLE": "trainer", "PARAMSHARD_SERVERS": "a:1", "PARAMSHARD_TRAINER_ID": "2"}, "expected 0..0"),
    ({"PARAMSHARD_ROLE": "server", "PARAMSHARD_SERVERS": "a:1"}, "PARAMSHARD_SERVER_ID=None"),
    ({"PARAMSHARD_MODE": "fast"}, "PARAMSHARD_MODE='fast'"),
    ({"PARAMSHARD_TIMEOUT": "0"}, "must be > 0"),
])
def test_bad_environment_is_named(environ, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        ClusterEnv.from_environ(environ)


def test_generated_table_lists_every_variable():
    table = variables_markdown()
    for name in ("PARAMSHARD_ROLE", "PARAMSHARD_SERVERS", "PARAMSHARD_MODE", "PADDLE_TRAINERS_NUM"):
        assert name in table


def test_collective_and_hybrid_contracts():
    trainer = {"PARAMSHARD_ROLE": "trainer", "PARAMSHARD_TRAINERS": "2", "PARAMSHARD_TRAINER_ID": "1"}
    env = ClusterEnv.from_environ({**trainer, "PARAMSHARD_MODE": "collective",
                                   "PARAMSHARD_COLLECTIVE_ADDR": "10.0.0.1:29500"})
    assert env.servers == () and env.collective and env.server_mode == "sync"
    assert ClusterEnv.from_environ(env.to_environ() | {"PARAMSHARD_ROLE": "trainer"}) == env
    hybrid = ClusterEnv.from_environ({**trainer, "PARAMSHARD_MODE": "hybrid", "PARAMSHARD_SERVERS": "h:1",
                                      "PARAMSHARD_COLLECTIVE_ADDR": "h:2", "PARAMSHARD_COLLECTIVE_FD": "7"})
    assert hybrid.collective and hybrid.server_mode == "sync" and hybrid.collective_fd == 7
    assert ClusterEnv.from_environ({"PARAMSHARD_MODE": "async"}).server_mode == "async"


@pytest.mark.parametrize("environ, message", [
    ({"PARAMSHARD_MODE": "collective", "PARAMSHARD_SERVERS": "h:1"}, "collective has no parameter servers"),
    ({"PARAMSHARD_MODE": "hybrid", "PARAMSHARD_ROLE": "trainer", "PARAMSHARD_TRAINERS": "2",
      "PARAMSHARD_SERVERS": "h:1"}, "needs PARAMSHARD_COLLECTIVE_ADDR"),
    ({"PARAMSHARD_MODE": "collective", "PARAMSHARD_COLLECTIVE_ADDR": "nohost"}, "is not host:port"),
    ({"PARAMSHARD_COLLECTIVE_BACKEND": "mpi"}, "expected one of ('gloo', 'nccl')"),
    ({"PARAMSHARD_MODE": "sync", "PARAMSHARD_ROLE": "trainer"}, "a trainer needs PARAMSHARD_SERVERS"),
])
def test_bad_collective_contracts_are_named(environ, message):
    with pytest.raises(ConfigError) as err:
        ClusterEnv.from_environ(environ)
    assert message in str(err.value)


def test_insecure_and_host_round_trip_through_environ():
    env = ClusterEnv(role="trainer", servers=("a:1",), insecure=True, host="10.0.0.2")
    assert env.to_environ()["PARAMSHARD_INSECURE"] == "1" and env.to_environ()["PARAMSHARD_HOST"] == "10.0.0.2"
    assert ClusterEnv.from_environ(env.to_environ()) == env
    with pytest.raises(ConfigError, match="PARAMSHARD_INSECURE=1 .* PARAMSHARD_SECRET is set too: unset one"):
        ClusterEnv.from_environ({"PARAMSHARD_INSECURE": "1", "PARAMSHARD_SECRET": "s"})


@pytest.mark.parametrize("mode", ["collective", "hybrid"])
def test_deltas_are_refused_where_the_dense_parameters_are_not_on_servers(mode):
    servers = () if mode == "collective" else ("127.0.0.1:1",)
    with pytest.raises(ConfigError, match=f"in {mode} mode the dense parameters are not on servers"):
        ClusterEnv(role=None, servers=servers, mode=mode, delta_dir="/tmp/deltas")
    ClusterEnv(role=None, servers=("127.0.0.1:1",), mode="async", delta_dir="/tmp/deltas")
