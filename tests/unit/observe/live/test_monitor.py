"""observe/live/monitor.py: the launcher's watcher stops at once, whatever it waits for."""
import threading
import time

import pytest

from paramshard.errors import Cancelled
from paramshard.launch.engines.ports import free_ports
from paramshard.observe.live.monitor import Monitor
from paramshard.transport.links import ServerLinks


class _Records:
    """The part of a run directory the monitor writes to."""

    def __init__(self):
        self.records = []

    def server_record(self, record):
        self.records.append(record)

    def latest(self):
        return ()

    def write_plan(self, stats):
        pass


@pytest.fixture
def silent_address():
    """An address nothing listens on: a server stopped before it ever answered."""
    return f"127.0.0.1:{free_ports(1, '127.0.0.1')[0]}"


def test_a_cancelled_wait_ends_within_a_poll_slice(silent_address):
    with ServerLinks([silent_address], timeout=30.0, who="watcher") as links:
        cancel = threading.Event()
        ticket = links.submit([(0, {"op": "stats"}, ())])
        threading.Timer(0.2, cancel.set).start()
        start = time.monotonic()
        with pytest.raises(Cancelled, match="watcher stopped waiting for 1 replies"):
            links.collect(ticket, cancel=cancel)
        assert time.monotonic() - start < 2.0        # the deadline is 30 s + 4 s
        assert not ticket.pending                     # its late reply would be dropped


def test_stopping_the_monitor_does_not_wait_out_a_request_to_a_server_that_never_answered(silent_address):
    with ServerLinks([silent_address], timeout=30.0, who="launcher (run directory)") as links:
        records = _Records()
        monitor = Monitor(records, links, every=10.0).start()    # its request waits up to 5 s
        time.sleep(0.3)
        start = time.monotonic()
        monitor.stop()
        took = time.monotonic() - start
        assert not monitor._thread.is_alive()
        assert took < 4.0, f"stop() took {took:.1f} s: it waited for the stats request's deadline"
        assert records.records == []


# -- the records the monitor makes from the servers' stats replies --------------------------------
def _wire(server, requests, pushes, push_seconds, answered=0, waited=0.0, staleness=None, tables=None):
    wire = {"server": server, "address": f"127.0.0.1:{6000 + server}", "uptime_s": 1.0,
            "trainers": {"live": [0, 1], "left": [], "lost": []}, "phase_seconds": {"push_dense": push_seconds},
            "requests": requests, "bytes_in": 10 * requests, "bytes_out": 20 * requests, "errors": 0, "timeouts": 0,
            "op_push_dense": pushes, "deferred_answered": answered, "deferred_wait_s": waited,
            "dense_blocks": 2, "dense_elements": 100 + server}
    if staleness is not None:
        wire["staleness"] = staleness
    if tables is not None:
        wire.update({"sparse_rows": 5, "sparse_bytes": 80, "tables": tables})
    return wire


def test_a_server_record_has_rates_against_the_previous_reply():
    from paramshard.observe.live.monitor import server_record
    from paramshard.messages.server_stats import ServerStats
    first = ServerStats.from_wire(_wire(0, 10, 4, 0.4, answered=2, waited=1.0))
    second = ServerStats.from_wire(_wire(0, 30, 8, 1.2, answered=6, waited=3.0, staleness={"0": 3, "1": 1}))
    assert server_record(first, None, 100.0, None) == {
        "kind": "server", "t": 100.0, "server": 0, "rows": 0, "elements": 100, "bytes_in": 100, "bytes_out": 200,
        "requests": 10, "requests_per_s": None, "queue_s": 0.5, "update_s": 0.1, "staleness": {},
        "live_trainers": 2, "uptime_s": 1.0}
    record = server_record(second, first, 102.0, 100.0)
    assert record["requests_per_s"] == 10.0                   # 20 requests in 2 s
    assert record["queue_s"] == 0.5 and record["update_s"] == 0.2
    assert record["staleness"] == {"0": 3, "1": 1}            # JSON keys, as the run directory stores them


def test_a_restarted_server_has_rates_from_its_new_start_never_negative():
    from paramshard.observe.live.monitor import server_record
    from paramshard.messages.server_stats import ServerStats
    old = ServerStats.from_wire(dict(_wire(0, 500, 40, 2.0), uptime_s=30.0))
    new = ServerStats.from_wire(dict(_wire(0, 20, 2, 0.1), uptime_s=0.5))   # restarted in place 0.5 s ago
    record = server_record(new, old, 102.0, 100.0)
    assert record["requests_per_s"] == 40.0             # 20 requests since it started, 0.5 s ago
    assert record["update_s"] == 0.05 and record["uptime_s"] == 0.5
    # A new process seen first 2.5 s after its start, with more requests than the old one had at
    # its last record taken 1 s after its own start: only the start says it is another process.
    old = ServerStats.from_wire(dict(_wire(0, 3, 0, 0.0), uptime_s=1.0, started_at=99.0))
    new = ServerStats.from_wire(dict(_wire(0, 41, 4, 0.2), uptime_s=2.5, started_at=103.5))
    assert server_record(new, old, 106.0, 100.0)["requests_per_s"] == round(41 / 2.5, 2)


class _Links:
    """Two servers answering ``stats`` at once (the ServerLinks calls the monitor makes)."""

    def __init__(self, replies):
        self.replies, self.asked = replies, []

    def __len__(self):
        return len(self.replies)

    def submit(self, requests, timeout=None):
        self.asked.append(requests)
        return requests

    def collect(self, ticket, cancel=None):
        [(server, header, _)] = ticket
        assert header == {"op": "stats"}
        reply = self.replies[server]
        if isinstance(reply, Exception):
            raise reply
        return [({"stats": reply}, [])]


class _PlanRecords(_Records):
    def __init__(self):
        super().__init__()
        self.plans = []

    def write_plan(self, stats):
        self.plans.append(stats)


def test_poll_records_every_server_that_answers_and_writes_the_plan_once_all_did():
    from paramshard.errors import ServerUnavailable
    tables = {"emb": {"rows": 5, "bytes": 80, "version": 1, "evicted": 0, "dim": 4, "rows_updated": 5,
                      "phase_seconds": {}}}
    links = _Links([_wire(0, 1, 0, 0.0, tables=tables), ServerUnavailable("server 1 is down")])
    records = _PlanRecords()
    monitor = Monitor(records, links, every=1.0)
    monitor.poll()
    assert [r["server"] for r in records.records] == [0] and records.plans == []
    links.replies[1] = _wire(1, 1, 0, 0.0)
    monitor.poll()
    monitor.poll()
    assert [r["server"] for r in records.records] == [0, 0, 1, 0, 1]
    [plan] = records.plans                                   # once, with every server's typed stats
    assert [s.server for s in plan] == [0, 1] and plan[0].tables["emb"].dim == 4


def test_a_garbled_reply_is_skipped_like_a_server_that_did_not_answer():
    links = _Links([{"server": "zero"}])
    records = _Records()
    Monitor(records, links, every=1.0).poll()
    assert records.records == []


def test_a_poll_in_the_middle_of_the_registration_is_followed_by_the_whole_plan():
    """The chief registers the model with one server after another; with ranks that start fast
    (forked) a poll came between the two, and plan.json kept server 1 holding nothing for good.
    The plan is written again once it holds more, and not again for a move that only shifts it."""
    half = dict(_wire(1, 1, 0, 0.0), dense_blocks=0, dense_elements=0)
    links = _Links([_wire(0, 1, 0, 0.0), half])
    records = _PlanRecords()
    monitor = Monitor(records, links, every=1.0)
    monitor.poll()
    assert [[s.dense_elements for s in plan] for plan in records.plans] == [[100, 0]]
    links.replies[1] = _wire(1, 2, 0, 0.0)                   # the registration reached server 1
    monitor.poll()
    monitor.poll()
    assert [[s.dense_elements for s in plan] for plan in records.plans] == [[100, 0], [100, 101]]
    links.replies[0], links.replies[1] = dict(_wire(0, 3, 0, 0.0), dense_elements=150), \
        dict(_wire(1, 3, 0, 0.0), dense_elements=51)         # a move: the same model elsewhere
    monitor.poll()
    assert len(records.plans) == 2
