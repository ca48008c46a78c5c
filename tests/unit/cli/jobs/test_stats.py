"""cli/jobs/stats.py: on a file, a pipe or a rank's forwarded output, `paramshard stats` prints a
plain table every few seconds instead of redrawing a screen (no escape codes in a file)."""
import argparse
import contextlib

import numpy as np

from paramshard.cli.jobs import stats


def test_not_on_a_terminal_the_table_is_printed_plainly_each_time(monkeypatch, capsys):
    monkeypatch.setattr(stats, "_target", lambda args: None)
    monkeypatch.setattr(stats.control, "connect", lambda *a, **k: contextlib.nullcontext([]))
    monkeypatch.setattr(stats, "_table", lambda links, before: (["server 0: 12 requests/s  5 rows"], []))
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt            # Ctrl-C ends it, as on a terminal
    monkeypatch.setattr(stats.time, "sleep", sleep)
    monkeypatch.setattr(stats, "is_live_terminal", lambda stream: False)
    args = argparse.Namespace(json=False, once=False, every=2.0)
    assert stats.run(args) == 0
    out = capsys.readouterr().out
    assert out.count("server 0: 12 requests/s  5 rows\n") == 3 and "\x1b" not in out
    assert sleeps == [2.0, 2.0, 2.0]


# -- every server the job has now: the routing server 0 holds names those a scale added ----------------

class FakeLinks:
    """Links to the servers ``ids`` (index i -> server ids[i]); server 0 answers ``routing_get``
    with ``addresses`` (every server the job ever had, "" for one a scale removed)."""

    def __init__(self, ids, addresses=None):
        self.ids, self.addresses, self.closed = list(ids), addresses, False

    def __len__(self):
        return len(self.ids)

    def _reply(self, index, header):
        from paramshard.placement.partitions import Routing
        from paramshard.messages.server_stats import ServerStats
        server = self.ids[index]
        if header["op"] == "routing_get":
            assert server == 0, "the routing is asked of server 0"
            live = [i for i, a in enumerate(self.addresses) if a]
            routing = Routing(3, 16, np.array([live[p % len(live)] for p in range(16)]), tuple(self.addresses))
            return {"routing": routing.to_wire()}, []
        return {"stats": ServerStats(server=server, counters={"requests": 10 * (server + 1)}).to_wire()}, []

    def request(self, server, header, arrays=(), timeout=None):
        return self._reply(server, header)

    def submit(self, requests, timeout=None):
        return [self._reply(s, h) for s, h, _ in requests]

    def collect(self, ticket, cancel=None):
        return ticket

    def close(self):
        self.closed = True


def job_servers(addresses):
    from paramshard.observe.live.server_list import JobServers
    links = FakeLinks([0, 1], addresses)
    connected = {}

    def connect_one(address):
        connected[address] = FakeLinks([links.addresses.index(address)])
        return connected[address]
    return JobServers(links, connect_one), connected


def test_stats_lists_the_servers_a_scale_added_and_says_which_it_removed():
    servers, connected = job_servers(["h:0", "h:1", "h:2"])
    lines, raw = stats._table(servers, {})
    assert [line.split(":")[0] for line in lines] == ["server 0", "server 1", "server 2"], lines
    assert [r["server"] for r in raw] == [0, 1, 2] and list(connected) == ["h:2"]
    # then scaled down to 2 and up again: server 2 was removed, server 3 added
    servers.links.addresses = ["h:0", "h:1", "", "h:3"]
    lines, raw = stats._table(servers, {})
    assert [line.split(":")[0] for line in lines] == ["server 0", "server 1", "server 3", "server 2"], lines
    assert lines[-1] == "server 2: removed by a scale (it exits once no trainer routes to it)"
    assert [r["server"] for r in raw] == [0, 1, 3]
    servers.close()
    assert all(links.closed for links in connected.values())


def test_a_job_with_fixed_routing_lists_its_servers_as_before():
    servers, connected = job_servers(["h:0", "h:1"])
    assert [line.split(":")[0] for line in stats._table(servers, {})[0]] == ["server 0", "server 1"]
    assert connected == {}


def test_the_launchers_monitor_records_the_servers_a_scale_added():
    from paramshard.observe.live.monitor import Monitor
    records = []

    class Run:
        def server_record(self, record):
            records.append(record)

        def write_plan(self, stats):
            pass
    links = FakeLinks([0, 1], ["h:0", "h:1", "h:2"])
    Monitor(Run(), links, connect_one=lambda address: FakeLinks([2])).poll()
    assert [r["server"] for r in records] == [0, 1, 2]
