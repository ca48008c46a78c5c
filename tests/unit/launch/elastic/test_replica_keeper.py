"""launch/elastic/replica_keeper.py against in-process servers behind fake links (no sockets): it copies,
notices a lost server, restores its copy onto the restarted one and records all of it; plus
the launch checks of --recovery and the trainers' wait for a server to serve again
(client/recovery.ServeAgain)."""
import argparse

import numpy as np
import pytest

from paramshard.cli.jobs.launch import _checkpoint_fields
from paramshard.client.recovery import ServeAgain
from paramshard.errors import ConfigError, DeadlineExceeded, RemoteError, ServerUnavailable
from paramshard.launch.api import LaunchConfig
from paramshard.launch.elastic.replica_keeper import ReplicaKeeper

from tests.unit.server.elastic.test_replication import call, register, server, state, train


class FakeLinks:
    """ServerLinks' calls, answered by in-process servers; ``None`` in ``servers`` is a dead one."""

    def __init__(self, servers):
        self.servers, self.epoch, self.who, self.retry = servers, 0, "trainer 0", None
        self.links = [type("L", (), {"address": f"127.0.0.1:{i}"})() for i in range(len(servers))]

    def submit(self, requests, timeout=None):
        return list(requests)

    def collect(self, ticket):
        out = []
        for server, header, arrays in ticket:
            if self.servers[server] is None:
                raise ServerUnavailable(f"server {server} is gone")
            out.append(call(self.servers[server], header, arrays))
        return [(dict(r.fields, ok=True), list(r.arrays)) for r in out]

    def request(self, server, header, arrays=(), timeout=None):
        return self.collect(self.submit([(server, header, arrays)]))[0]

    def close(self):
        pass


def test_keeper_copies_then_restores_a_restarted_server_and_records_it():
    servers = [server(), server()]
    events = []
    keeper = ReplicaKeeper(["a", "b"], 5.0, record=lambda event, text, **f: events.append((event, f)),
                           links=FakeLinks(servers))
    keeper.refresh(0), keeper.refresh(1)
    assert keeper.latest() is None                       # nothing registered: nothing worth restoring
    for s in servers:
        register(s)
    rng = np.random.default_rng(0)
    for s in servers:
        train(s, rng, 4, first_step=0)
    keeper.refresh(0), keeper.refresh(1)
    assert keeper.latest() is not None
    before = state(servers[1])
    servers[1] = None                                    # killed
    keeper.refresh(1)
    assert [f["what"] for _, f in events if f.get("server") == 1][-1] == "lost"
    servers[1] = server(recovering=True)                 # the launcher restarted it in place
    keeper.refresh(1)
    assert servers[1].generation == 0
    after = state(servers[1])
    assert before[0] == after[0] and before[2] == after[2] and before[4] == after[4]
    for a, b in zip(before[3].values(), after[3].values()):
        np.testing.assert_array_equal(a, b)
    restored = [f for _, f in events if f.get("what") == "restored"]
    assert len(restored) == 1 and restored[0]["server"] == 1 and restored[0]["updates_in_copy"] == 2 * 2 * 4
    assert restored[0]["recovery_s"] >= restored[0]["restore_s"] >= 0
    keeper.refresh(1)                                    # copies the restored server again, as any other
    assert keeper.copied_at[1] is not None
    keeper.stop()
    assert any(f.get("what") == "refreshes" for _, f in events)


class Hellos(FakeLinks):
    """A server 1 whose hello answers the given generations in turn (None: unreachable)."""

    def __init__(self, generations):
        super().__init__([None, None])
        self.generations = list(generations)

    def submit(self, requests, timeout=None, retry=True):
        assert requests == [(1, {"op": "hello"}, ())] and retry is False    # the probes never retry themselves
        return requests

    def collect(self, ticket):
        generation = self.generations.pop(0) if len(self.generations) > 1 else self.generations[0]
        if generation is None:
            raise ServerUnavailable("gone")
        return [({"generation": generation}, [])]


def test_serve_again_waits_for_the_replacement_in_this_epoch():
    links = Hellos([None, None, -1, -1, 0])
    links.retry = policy = ServeAgain(timeout=5.0, poll=0.0)
    policy.wait_serving(links, 1, ServerUnavailable("lost server 1"))
    assert len(policy.waits) == 1 and links.generations == [0]


def test_serve_again_gives_up_naming_the_server():
    with pytest.raises(DeadlineExceeded, match=r"server 1 \(127.0.0.1:1\) did not serve again within 0.05 s"):
        ServeAgain(timeout=0.05, poll=0.01).wait_serving(Hellos([-1]), 1, ServerUnavailable("lost"))
    cause = RemoteError("server 1", "reset", "rolled back")
    with pytest.raises(RemoteError):      # a rollback moved the job on: nothing to resend into
        ServeAgain(timeout=5.0, poll=0.0).wait_serving(Hellos([3]), 1, cause)


def test_bounded_loss_needs_async_and_restarts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(ConfigError, match="--mode sync cannot lose updates"):
        LaunchConfig(script=str(script), servers=2, recovery="bounded-loss", mode="sync", max_restarts=1)
    LaunchConfig(script=str(script), servers=2, recovery="bounded-loss", mode="async", max_restarts=1)
    flags = argparse.Namespace(recovery="bounded-loss", max_restarts=0, checkpoint_every=None, checkpoint_dir=None,
                               keep=3, resume=None, trainers=2, min_trainers=None)
    with pytest.raises(ConfigError, match="give --max-restarts N"):
        _checkpoint_fields(flags)
    flags.max_restarts = 1            # no checkpoint directory needed: the replica is what comes back
    assert _checkpoint_fields(flags) == {"checkpoint_keep": 3}


def test_keeper_follows_the_routing_servers_join_and_leave_and_one_without_blocks_counts_as_whole():
    from paramshard.placement.partitions import Routing

    class Links(FakeLinks):
        def add_server(self, address):
            self.added = getattr(self, "added", []) + [address]

        def retire(self, index):
            self.let_go = getattr(self, "let_go", []) + [index]

    servers = [server(), server(), server()]
    for s in servers[:2]:
        register(s)
    links = Links(servers)
    routing = Routing.initial(64, ("a", "b"))
    answers = {"routing": routing}
    links.request = lambda s, header, arrays=(), timeout=None: (
        ({"routing": answers["routing"].to_wire()}, []) if header["op"] == "routing_get"
        else FakeLinks.request(links, s, header, arrays))
    keeper = ReplicaKeeper(["a", "b"], 5.0, links=links, partitions=64)
    keeper.follow_routing()
    assert keeper.followed == [0, 1]
    # A scale added server 2 (its blocks: none) and then removed server 1.
    answers["routing"] = routing.moved_to(np.array([p % 2 * 2 for p in range(64)]), addresses=["a", "", "c"],
                                          blocks={"w": 0})
    keeper.follow_routing()
    assert links.added == ["c"] and keeper.followed == [0, 2] and keeper.retired == {1} and links.let_go == [1]
    for s in (0, 2):
        keeper.refresh(s)
    assert keeper.replicas[2].dense is None and keeper.latest() is not None     # it holds no block: whole
    answers["routing"] = Routing.initial(64, ("a", "b"))      # a restarted server 0's first map: older, ignored
    keeper.follow_routing()
    assert keeper.routing["version"] == 1 and keeper.followed == [0, 2]
