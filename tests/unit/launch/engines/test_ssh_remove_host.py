"""SshLauncher's `scale --remove-host HOST` handler (launch/engines/ssh.py) over fake ranks: it finds what
runs on the host from the processes themselves, moves exactly those servers, asks exactly those
trainers to leave, drops the host from the placement and records the event; a refusal changes
nothing at all."""
import dataclasses
import types

import pytest

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.launch.elastic.elastic_trainers import ElasticTrainers
from paramshard.launch.engines.hosts import parse_hosts
from paramshard.launch.engines.ssh import SshLauncher
from paramshard.launch.engines.ssh_placement import SshPlacement


@dataclasses.dataclass(eq=False)
class Rank:
    host: object
    code: int | None = None
    tag: str = ""

    def poll(self):
        return self.code


class Scaler:
    def __init__(self, serving, moving=False):
        self.serving, self._moving, self.removed = serving, moving, []

    def moving(self):
        return self._moving

    def remove(self, servers):
        self.removed.append(servers)


def launcher(servers="abab", trainers="abba", minimum=1, partitions=256, moving=False):
    hosts = parse_hosts("a,b,c")
    by = {h.host: h for h in hosts}
    ssh = SshLauncher.__new__(SshLauncher)
    ssh.servers = [Rank(by[h]) for h in servers]
    ssh.trainers = [Rank(by[h], tag=f"trainer {i}") for i, h in enumerate(trainers)]
    ssh.asked, ssh.events, ssh.membership_listeners = [], [], []
    ssh.engine = types.SimpleNamespace(ask_to_leave=lambda p: ssh.asked.append(p.tag))
    env = ClusterEnv(role=None, partitions=partitions)
    ssh.spec = types.SimpleNamespace(servers=[types.SimpleNamespace(env=env)], trainers=ssh.trainers)
    ssh.min_trainers = minimum
    ssh.elastic = ElasticTrainers(ssh, minimum) if minimum else None
    ssh.elastic_servers = Scaler(list(range(len(servers))), moving)
    ssh.event_listeners = [lambda *a, **f: ssh.events.append((a, f))]
    ssh.placement = SshPlacement(hosts, None, None, engine_hosts=dict(by), machines=(), live_hosts=lambda: [],
                                 probe=None, dispatch=None)
    return ssh


def test_the_hosts_servers_and_trainers_go_and_the_host_leaves_the_placement():
    ssh = launcher()
    reply = ssh._remove_host("b")
    assert reply.startswith("host b removed from the job: moving the partitions and dense blocks of servers "
                            "[1, 3] to servers [0, 2] in the background"), reply
    assert "asked trainers [1, 2] to leave at their next step boundary (4 -> 2 trainers)" in reply
    assert ssh.elastic_servers.removed == [[1, 3]] and ssh.asked == ["trainer 1", "trainer 2"]
    assert [h.host for h in ssh.placement.job_hosts()] == ["a", "c"]
    (event, fields), = [(a[0], f) for a, f in ssh.events]
    assert event == "host_removed" and fields == {"host": "b", "servers": [1, 3], "servers_after": [0, 2],
                                                  "trainers": [1, 2], "trainers_after": 2}
    # A server that a scale retired earlier, or a trainer already leaving, is not counted again.
    ssh = launcher()
    ssh.elastic_servers.serving = [0, 1, 2]
    ssh.elastic.leaving.add(ssh.trainers[2])
    assert "servers [1] to servers [0, 2]" in ssh._remove_host("b") and ssh.asked == ["trainer 1"]


def test_a_host_running_nothing_only_leaves_the_placement():
    ssh = launcher()
    assert ssh._remove_host("c") == "host c removed from the job: it ran no rank; no rank started from now on " \
                                    "goes there"
    assert ssh.elastic_servers.removed == [] and ssh.asked == []


@pytest.mark.parametrize("host, kw, why", [
    ("d", {}, r"--remove-host d: not one of this job's hosts \(a, b, c\)"),
    ("a", {}, r"it runs server 0"),
    ("b", {"trainers": "abbb"}, r"its trainers \[1, 2, 3\] leaving would leave 1, fewer than the job's minimum 2"),
    ("b", {"moving": True}, r"a move of partitions is under way"),
    ("b", {"minimum": None}, r"this job is not elastic"),
    ("b", {"partitions": 0}, r"fixed hash"),
])
def test_a_refusal_moves_nothing_asks_nobody_and_keeps_the_host(host, kw, why):
    if "trainers" in kw:
        kw["minimum"] = 2
    ssh = launcher(**kw)
    with pytest.raises(ConfigError, match=why):
        ssh._remove_host(host)
    assert ssh.elastic_servers.removed == [] and ssh.asked == [] and ssh.events == []
    assert [h.host for h in ssh.placement.job_hosts()] == ["a", "b", "c"]


def test_a_host_removed_already_is_said_so():
    ssh = launcher()
    ssh._remove_host("c")
    with pytest.raises(ConfigError, match="c was removed from this job already"):
        ssh._remove_host("c")
