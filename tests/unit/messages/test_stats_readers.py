"""Who reads a server's stats: client/control.py (the one place that asks) and
observe/live/server_watch.py (what a server process leaves for the run directory)."""
import dataclasses
import json

import pytest

from paramshard.client import control
from paramshard.env import ClusterEnv
from paramshard.errors import ProtocolError
from paramshard.observe.run_records.records import MARK
from paramshard.observe.live.server_watch import ServerWatch
from paramshard.server.assembly import build_server
from paramshard.server.core.in_process import LocalLinks
from paramshard.messages.server_stats import ServerStats

ENV = ClusterEnv(role="server", servers=("127.0.0.1:1",), server_id=0, num_trainers=1)


@pytest.fixture
def server():
    s = build_server(ENV, in_process=True, watch_peers=False)
    yield s
    s.close()


def test_server_stats_are_the_servers_own_snapshot_checked_and_plain(server):
    links = LocalLinks(server, timeout=5.0)
    [wire] = control.server_stats(links)
    assert type(wire) is dict and json.loads(json.dumps(wire)) == wire
    assert list(wire) == list(server.snapshot_stats())       # the same layout (its figures moved on since)
    stats = control.read_stats(links, 0)
    assert isinstance(stats, ServerStats) and stats.server == 0 and stats.barriers.waiting == {}
    assert stats.counter("op_stats") >= 1                  # the asks themselves are counted


def test_a_reply_without_stats_is_a_protocol_error():
    class Links:
        def submit(self, requests, timeout=None):
            return requests

        def collect(self, ticket):
            return [({"server": 0}, [])]
    with pytest.raises(ProtocolError, match="without a 'stats' field"):
        control.read_stats(Links(), 0)


def test_the_barrier_says_who_is_missing_from_server_0s_stats(server):
    links = LocalLinks(server, timeout=5.0)
    assert "no trainer waiting in it" in control._missing(links, "epoch")


def test_a_server_under_the_launcher_prints_its_last_record_when_it_stops(server, capsys):
    watch = ServerWatch(dataclasses.replace(ENV, records="stdout"), server)
    watch.close(0)
    [line] = capsys.readouterr().out.split("\n")[:-1]      # (splitlines would split at MARK's \x1e)
    assert line.startswith(MARK)
    record = json.loads(line[len(MARK):])
    assert record["kind"] == "server" and record["server"] == 0 and record["final"] is True


def test_a_server_that_never_served_leaves_no_record(server, capsys):
    ServerWatch(dataclasses.replace(ENV, records="stdout"), server).close(None)
    ServerWatch(ENV, server).close(0)                        # not under the launcher: nothing on stdout
    assert capsys.readouterr().out == ""
