"""Per-connection accounting of unread replies (server/core/outbox.py): pure logic, fake trackers."""
import pytest

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.limits import Limits
from paramshard.server.core import outbox
from paramshard.server.core.outbox import GO, HELD, MAX_HELD, REFUSED, TRACK_BYTES, Outbox, describe_identity


class Tracker:
    def __init__(self):
        self.done = False


def sent(box, identity, nbytes):
    """Send like ParameterServer._send: tracked when the outbox says so; the tracker or None."""
    tracker = Tracker() if box.track(identity, nbytes) else None
    box.sent(identity, tracker, nbytes)
    return tracker


def test_a_connection_under_the_limit_goes_through_and_released_replies_stop_counting():
    box = Outbox(max_queued_bytes=30000, hold_seconds=60)
    assert box.admit(b"a", ["req"], 10) == GO
    t1, t2 = sent(box, b"a", 20000), sent(box, b"a", 20000)
    assert box.queued(b"a") == 40000
    assert box.admit(b"b", ["req"], 10) == GO            # per connection: b owes nothing
    assert box.admit(b"a", ["req"], 10) == HELD
    t1.done = True
    assert box.queued(b"a") == 20000
    t2.done = True
    assert box.queued(b"a") == 0


def test_small_replies_are_counted_until_a_later_tracked_one_is_released():
    box = Outbox(max_queued_bytes=1 << 30, hold_seconds=60)
    untracked = [sent(box, b"a", 100) for _ in range(5)]
    assert untracked == [None] * 5 and box.queued(b"a") == 500
    big = sent(box, b"a", TRACK_BYTES)
    assert big is not None and box.queued(b"a") == 500 + TRACK_BYTES
    big.done = True                     # libzmq frees in order: the small ones before it are gone too
    assert box.queued(b"a") == 0


def test_under_a_tiny_limit_every_reply_is_tracked():
    box = Outbox(max_queued_bytes=10, hold_seconds=60)
    assert sent(box, b"a", 50) is not None


def test_over_the_limit_requests_wait_in_order_and_go_one_at_a_time_once_replies_drain():
    box = Outbox(max_queued_bytes=1000, hold_seconds=60)
    big = sent(box, b"a", 5000)
    assert [box.admit(b"a", [i], 10) for i in range(3)] == [HELD] * 3
    handled, refused, dropped = [], [], []
    assert not box.release(handled.append, refused.append, dropped.append)
    assert handled == [] and box.has_held()
    big.done = True
    assert box.release(handled.append, refused.append, dropped.append)
    assert handled == [[0]]                       # one per call: its reply counts before the next goes
    sent(box, b"a", 5000)                         # that reply puts the connection over again
    box.release(handled.append, refused.append, dropped.append)
    assert handled == [[0]] and refused == [] and dropped == []


def test_a_new_request_queues_behind_held_ones_even_once_under_the_limit():
    box = Outbox(max_queued_bytes=1000, hold_seconds=60)
    big = sent(box, b"a", 5000)
    assert box.admit(b"a", ["first"], 10) == HELD
    big.done = True
    assert box.admit(b"a", ["second"], 10) == HELD        # never overtakes the first
    handled = []
    while box.release(handled.append, None, None):
        pass
    assert handled == [["first"], ["second"]] and not box.has_held()


def test_held_requests_past_their_deadline_are_refused_and_a_full_hold_refuses_at_once():
    box = Outbox(max_queued_bytes=1000, hold_seconds=0)
    sent(box, b"a", 5000)
    assert box.admit(b"a", ["old"], 10) == HELD
    refused = []
    box.release(None, refused.append, None)
    assert refused == [["old"]] and not box.has_held()
    box.hold_seconds = 60
    assert [box.admit(b"a", [i], 0) for i in range(MAX_HELD)] == [HELD] * MAX_HELD
    assert box.admit(b"a", ["more"], 0) == REFUSED
    message = box.refusal(b"a", "server 0")
    assert "PARAMSHARD_MAX_QUEUED_BYTES=1000" in message and "5000 bytes" in message and "\n" not in message


def test_big_held_requests_are_not_refused_for_their_size():
    """A trainer's held pushes can be as big as its model: refusing them would refuse a reader."""
    box = Outbox(max_queued_bytes=1000, hold_seconds=60)
    sent(box, b"a", 5000)
    assert [box.admit(b"a", ["push"], 10**9) for _ in range(3)] == [HELD] * 3


def test_held_requests_of_a_gone_connection_are_dropped_not_handled():
    box = Outbox(max_queued_bytes=1000, hold_seconds=60)
    big = sent(box, b"a", 5000)
    for i in range(3):
        box.admit(b"a", [i], 10)
    box.connection(b"a").gone = True
    big.done = True
    dropped = []
    box.release(None, None, dropped.append)
    assert dropped == [[0], [1], [2]] and not box.has_held()


def test_sweep_forgets_idle_connections_and_keeps_busy_ones(monkeypatch):
    box = Outbox(max_queued_bytes=1000, hold_seconds=60)
    done = sent(box, b"done", 5000)
    done.done = True
    sent(box, b"busy", 5000)
    sent(box, b"tail", 10)
    box.sweep()
    assert box.queued(b"done") == 0 and len(box) == 2      # "done" forgotten; the tail is recent
    monkeypatch.setattr(outbox, "QUIET_SECONDS", 0.0)
    box.sweep()
    assert len(box) == 1 and box.queued(b"busy") == 5000


def test_identities_are_readable_in_log_lines():
    assert describe_identity(b"trainer 0-12-3") == "trainer 0-12-3"
    assert describe_identity(b"\x00\x6b\x8b\x45\x67") == "0x006b8b4567"


def test_the_limit_is_read_from_the_environment_and_checked():
    env = ClusterEnv.from_environ({"PARAMSHARD_MAX_QUEUED_BYTES": "4096"})
    assert env.limits.max_queued_bytes == 4096
    assert env.limits.to_environ() == {"PARAMSHARD_MAX_QUEUED_BYTES": "4096"}
    assert Limits().max_queued_bytes * 100 < 24 << 30      # 100 clients that never read cannot fill 24 GB
    with pytest.raises(ConfigError, match="PARAMSHARD_MAX_QUEUED_BYTES=0"):
        Limits(max_queued_bytes=0)
