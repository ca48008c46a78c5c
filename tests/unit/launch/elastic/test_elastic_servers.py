"""launch/elastic/elastic_servers.py driven through a fake JobControl (fake_job.py: the port and nothing
more) with a fake move: which servers start, what each scale moves to, what is refused and why, and the
membership told after each move."""
import threading

import pytest

from paramshard.errors import ConfigError
from paramshard.launch.elastic.elastic_servers import ElasticServers
from paramshard.launch.elastic.job_control import JobControl

from tests.unit.launch.elastic.fake_job import FakeJob


def make(**kw):
    moves = []
    gate = threading.Event()

    def scale(env, addresses, servers, event):
        moves.append((list(addresses), list(servers)))
        gate.wait(5)
    launcher = FakeJob(**kw)
    assert isinstance(launcher, JobControl)         # the whole port, as the Launcher has it
    launcher.retired = []
    return launcher, ElasticServers(launcher, scale=scale, retire=lambda env, a, removed, v: launcher.retired.append(
        (list(a), removed)) or True), moves, gate


def test_up_starts_a_server_knowing_every_address_then_down_moves_back_to_the_first_two():
    launcher, servers, moves, gate = make()
    assert "started servers [2]" in servers.scale(3)
    (rank,) = launcher.started
    assert rank.name == "server 2" and rank.env.server_id == 2
    assert rank.env.servers == ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    assert [p.tag for p in launcher.servers] == ["server 0", "server 1", "server 2"]
    with pytest.raises(ConfigError, match="a move of partitions is under way"):
        servers.scale(2)
    gate.set()
    servers.move.join(5)
    assert moves == [(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], [0, 1, 2])]
    assert [(a[0], f["server"], f["live"]) for a, f in launcher.told] == [("added", 2, 3)]
    assert "moving the partitions of servers [2]" in servers.scale(2)
    servers.move.join(5)
    assert moves[-1][1] == [0, 1] and launcher.told[-1][0][0] == "removed" and launcher.told[-1][1]["live"] == 2
    assert servers.scale(2) == "already 2 servers"
    # Dense blocks move too: one of the job's first servers may go (server 0 stays).
    assert "moving the partitions of servers [1]" in servers.scale(1)
    servers.move.join(5)
    assert moves[-1][1] == [0] and launcher.told[-1][1]["server"] == 1 and launcher.told[-1][1]["live"] == 1
    servers.retiring.join(5)
    # Issue 29: each removed server is stopped once no trainer needs it, and the moves after it
    # are given "" for it (nothing connects to a server that may have exited).
    assert [removed for _, removed in launcher.retired] == [[2], [1]]
    assert moves[-1][0] == ["127.0.0.1:1", "127.0.0.1:2", ""]
    assert "started servers [3]" in servers.scale(2)
    servers.move.join(5)
    assert moves[-1] == (["127.0.0.1:1", "", "", "127.0.0.1:4"], [0, 3])
    assert launcher.started[-1].env.servers == ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4")


@pytest.mark.parametrize("kw, n, why", [
    ({"partitions": 0}, 3, "launch it with --partitions P"),
    ({}, 0, "keeps at least one server"),
    ({"partitions": 2}, 3, "more servers than the job's 2 partitions"),
    ({"can_start": False}, 3, "cannot start a server mid-job"),
])
def test_refusals_say_why(kw, n, why):
    _, servers, moves, _ = make(**kw)
    with pytest.raises(ConfigError, match=why):
        servers.scale(n)
    assert moves == []


def test_a_job_that_writes_checkpoints_or_keeps_replicas_scales_its_servers():
    # Checkpoints and moves take turns on server 0 (checkpoint/turns.py), and the replica keeper
    # follows the job's routing (launch/elastic/replica_keeper.py): neither is refused any more.
    launcher, servers, moves, gate = make(checkpoint_dir="/tmp/ckpt", recovery="bounded-loss")
    gate.set()
    assert "started servers [2]" in servers.scale(3)
    servers.move.join(5)
    assert moves[-1][1] == [0, 1, 2]


def test_a_failed_move_is_recorded_and_changes_nothing():
    launcher = FakeJob()

    def scale(*a, **f):
        raise RuntimeError("server 2 never answered")
    servers = ElasticServers(launcher, scale=scale)
    servers.scale(3)
    servers.move.join(5)
    assert servers.serving == [0, 1] and "server 2 never answered" in servers.last_error
    assert launcher.events[-1][0][0] == "scale_failed" and launcher.told == []


def test_a_named_host_reaches_the_engines_address_and_only_when_servers_start():
    launcher, servers, moves, gate = make()
    gate.set()
    with pytest.raises(ConfigError, match="--on places new servers; this starts none"):
        servers.scale(2, host="10.0.0.3")
    assert "started servers [2]" in servers.scale(3, host="10.0.0.3")
    servers.move.join(5)
    assert launcher.asked_hosts == ["10.0.0.3"] and launcher.started[-1].env.servers[2] == "10.0.0.3:3"


def test_remove_moves_away_exactly_the_servers_named_not_the_highest():
    """scale --remove-host: server 1 of three (its host goes) gives its share to servers 0 and 2, then
    retires as a scale down's removed server does; the next scale counts from what serves."""
    launcher, servers, moves, gate = make()
    assert "started servers [2]" in servers.scale(3)
    gate.set()
    servers.move.join(5)
    with pytest.raises(ConfigError, match=r"servers \[0\]: only serving servers other than server 0"):
        servers.remove([0])
    with pytest.raises(ConfigError, match=r"servers \[5\]: only serving servers"):
        servers.remove([5])
    assert servers.remove([1]) == [0, 2]
    servers.move.join(5)
    assert moves[-1] == (["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], [0, 2])
    assert servers.serving == [0, 2] and servers.retired == {1}
    assert launcher.told[-1][0][0] == "removed" and launcher.told[-1][1]["server"] == 1
    servers.retiring.join(5)
    assert launcher.retired[-1] == (["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], [1])
    assert "moving the partitions of servers [2]" in servers.scale(1)
    servers.move.join(5)
    assert moves[-1] == (["127.0.0.1:1", "", "127.0.0.1:3"], [0])


def test_remove_is_refused_during_a_move_and_without_partitions():
    launcher, servers, moves, gate = make()
    servers.scale(3)
    with pytest.raises(ConfigError, match="a move of partitions is under way"):
        servers.remove([1])
    gate.set()
    servers.move.join(5)
    _, fixed, _, _ = make(partitions=0)
    with pytest.raises(ConfigError, match=r"servers \[1\]: this job routes ids by a fixed hash"):
        fixed.remove([1])


def test_a_removed_server_that_stopped_by_itself_is_said_to_exit_not_to_keep_running(caplog):
    """The retire request finds the removed server gone (it stopped once no trainer was connected:
    seen on `scale --remove-host`, its host's trainer leaving as it retired): it exited, and the log
    says so instead of "keep running, idle"."""
    launcher, servers, _, gate = make()
    gate.set()

    def gone(env, addresses, removed, version):
        raise ConnectionError("launcher (retiring servers) lost its connection to server 1")
    servers._retire = gone
    launcher.servers[1].code = 0                # server 1 exited
    caplog.set_level("INFO", logger="paramshard.launch")
    servers.scale(1)
    servers.move.join(5)
    servers.retiring.join(5)
    assert "servers [1] exit: they stopped by themselves" in caplog.text and "keep running" not in caplog.text
    servers._exited = lambda removed: False                   # still running: it does keep running
    servers.scale(2)
    servers.move.join(5)
    servers.scale(1)
    servers.move.join(5)
    servers.retiring.join(5)
    assert "keep running, idle, until the job ends: launcher (retiring servers) lost" in caplog.text
