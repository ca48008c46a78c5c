"""``ps.shard()`` is a pure function of the environment: it takes no role, starts no server."""
import pytest

import paramshard as ps
from paramshard import runtime
from paramshard.env import ClusterEnv


@pytest.fixture
def no_role_taken(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("ps.shard() took a role (runtime.init)")
    monkeypatch.setattr(runtime, "init", forbidden)


def test_shard_reads_the_trainer_from_the_environment(no_role_taken, monkeypatch):
    monkeypatch.setenv("PARAMSHARD_ROLE", "trainer")
    monkeypatch.setenv("PARAMSHARD_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("PARAMSHARD_TRAINERS", "3")
    monkeypatch.setenv("PARAMSHARD_TRAINER_ID", "1")
    assert ps.shard(list(range(9))) == [1, 4, 7]


def test_on_a_server_rank_shard_does_not_serve(no_role_taken, monkeypatch):
    monkeypatch.setenv("PARAMSHARD_ROLE", "server")
    monkeypatch.setenv("PARAMSHARD_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("PARAMSHARD_SERVER_ID", "0")
    assert ps.shard(list(range(4)), trainer_id=0, num_trainers=2) == [0, 2]    # explicit: no environment needed
    ps.shard(list(range(4)))        # returns (whatever share), instead of serving and exiting


def test_a_plain_run_is_trainer_0_of_1(no_role_taken, monkeypatch):
    for name in ("PARAMSHARD_ROLE", "PARAMSHARD_TRAINERS", "PARAMSHARD_TRAINER_ID", "PARAMSHARD_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    assert ps.shard(list(range(3))) == [0, 1, 2]


def test_an_env_of_ones_own_is_passed_as_numbers(no_role_taken, monkeypatch):
    """``init`` keeps nothing in the process: a script that made its env itself (not from the
    environment) gives ``shard`` its trainer and count."""
    monkeypatch.delenv("PARAMSHARD_ROLE", raising=False)
    env = ClusterEnv(role="trainer", servers=("127.0.0.1:1",), num_trainers=2, trainer_id=1)
    assert ps.shard(list(range(4)), trainer_id=env.trainer_id, num_trainers=env.num_trainers) == [1, 3]
