"""The Launcher's `scale --remove-host HOST` handler (launch/supervision/launcher.py) for a job placed on
hosts (SSH: launch/engines/ssh_placement.py) over fake ranks: it finds what runs on the host from the
ranks as they were started, moves exactly those servers, asks exactly those trainers to leave, drops the
host from the placement and records the event; a refusal changes nothing at all."""
import dataclasses
import types

import pytest

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.launch.api import JobSpec, RankSpec
from paramshard.launch.engines.hosts import parse_hosts
from paramshard.launch.engines.ssh_placement import SshPlacement
from paramshard.launch.supervision.launcher import Launcher
from paramshard.launch.supervision.listeners import JobListeners

class Rank:
    def __init__(self, tag):
        self.tag, self.code = tag, None

    def poll(self):
        return self.code


class Engine:
    def __init__(self):
        self.asked = []

    def start(self, rank):
        return Rank(rank.name)

    def ask_to_leave(self, p):
        self.asked.append(p.tag)


class Scaler:
    def __init__(self, serving, moving=False):
        self.serving, self._moving, self.removed = serving, moving, []

    def moving(self):
        return self._moving

    def remove(self, servers):
        self.removed.append(servers)


class OnHosts:
    """The SSH job's placement once started (ssh.SshHosts hands these to its SshPlacement)."""
    on_hosts = True

    def __init__(self, placement):
        self.placement = placement

    def find(self, text):
        return self.placement.find(text)

    def remove_host(self, host):
        self.placement.remove_host(host)


def launcher(servers="abab", trainers="abba", minimum=1, partitions=256, moving=False):
    hosts = parse_hosts("a,b,c")
    by = {h.host: h for h in hosts}
    env = ClusterEnv(role=None, partitions=partitions, servers=("127.0.0.1:1",) * len(servers),
                     num_trainers=len(trainers))
    spec = JobSpec(tuple(RankSpec(f"server {i}", dataclasses.replace(env, role="server", server_id=i), ("x",), h)
                         for i, h in enumerate(servers)),
                   tuple(RankSpec(f"trainer {i}", dataclasses.replace(env, role="trainer", trainer_id=i), ("x",), h)
                         for i, h in enumerate(trainers)))
    engine, events = Engine(), []
    placement = SshPlacement(hosts, None, None, engine_hosts=dict(by), machines=(), live_hosts=lambda: [],
                             probe=None, dispatch=None)
    ssh = Launcher(engine, OnHosts(placement), min_trainers=minimum,
                   server_scaler=lambda job: Scaler(list(range(len(servers))), moving),
                   listeners=JobListeners(events=(lambda *a, **f: events.append((a, f)),)))
    ssh.start_job(spec)
    ssh.server_scaler()          # as a `paramshard scale --servers` before made it
    return ssh, types.SimpleNamespace(asked=engine.asked, events=events, placement=placement)


def test_the_hosts_servers_and_trainers_go_and_the_host_leaves_the_placement():
    ssh, seen = launcher()
    reply = ssh._remove_host("b")
    assert reply.startswith("host b removed from the job: moving the partitions and dense blocks of servers "
                            "[1, 3] to servers [0, 2] in the background"), reply
    assert "asked trainers [1, 2] to leave at their next step boundary (4 -> 2 trainers)" in reply
    assert ssh.server_scaler().removed == [[1, 3]] and seen.asked == ["trainer 1", "trainer 2"]
    assert [h.host for h in seen.placement.job_hosts()] == ["a", "c"]
    (event, fields), = [(a[0], f) for a, f in seen.events]
    assert event == "host_removed" and fields == {"host": "b", "servers": [1, 3], "servers_after": [0, 2],
                                                  "trainers": [1, 2], "trainers_after": 2}
    # A server that a scale retired earlier, or a trainer already leaving, is not counted again.
    ssh, seen = launcher()
    ssh.server_scaler().serving = [0, 1, 2]
    ssh.elastic.leaving.add(ssh.trainers[2])
    assert "servers [1] to servers [0, 2]" in ssh._remove_host("b") and seen.asked == ["trainer 1"]


def test_a_host_running_nothing_only_leaves_the_placement():
    ssh, seen = launcher()
    assert ssh._remove_host("c") == "host c removed from the job: it ran no rank; no rank started from now on " \
                                    "goes there"
    assert ssh.server_scaler().removed == [] and seen.asked == []


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
    ssh, seen = launcher(**kw)
    with pytest.raises(ConfigError, match=why):
        ssh._remove_host(host)
    assert ssh.server_scaler().removed == [] and seen.asked == [] and seen.events == []
    assert [h.host for h in seen.placement.job_hosts()] == ["a", "b", "c"]


def test_a_host_removed_already_is_said_so():
    ssh, seen = launcher()
    ssh._remove_host("c")
    with pytest.raises(ConfigError, match="c was removed from this job already"):
        ssh._remove_host("c")
