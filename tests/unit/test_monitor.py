"""observe/monitor.py: the launcher's watcher stops at once, whatever it waits for."""
import threading
import time

import pytest

from paramshard.errors import Cancelled
from paramshard.launch.ports import free_ports
from paramshard.observe.monitor import Monitor
from paramshard.transport.client import ServerLinks


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
        monitor = Monitor(records, links, every=2.0).start()     # its request waits up to 5.4 s
        time.sleep(0.3)
        start = time.monotonic()
        monitor.stop()
        took = time.monotonic() - start
        assert not monitor._thread.is_alive()
        assert took < 2.0, f"stop() took {took:.1f} s: it waited for the stats request's deadline"
        assert records.records == []
