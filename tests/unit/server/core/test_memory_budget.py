"""The server-wide memory budget (server/core/memory_budget.py), the outbox totals it reads, the
limit's setting, and the client's busy retry schedule (transport/busy.py): pure logic."""
import gc

import numpy as np
import pytest

from paramshard.errors import ConfigError
from paramshard.limits import Limits
from paramshard.server.core import outbox
from paramshard.server.core.memory_budget import SMALL_REQUEST, MemoryBudget
from paramshard.server.core.outbox import HELD, Outbox
from paramshard.transport import busy
from paramshard.transport.busy import BusyRequests

BIG = SMALL_REQUEST + 1


class Tracker:
    def __init__(self):
        self.done = False


class Frame:
    """Stands for a zmq.Frame a hook keeps (weak-referenceable, as zmq.Frame is)."""


def test_outbox_totals_follow_every_connection_exactly():
    box = Outbox(max_queued_bytes=1000, hold_seconds=60)
    t1, t2 = Tracker(), Tracker()
    box.sent(b"a", t1, 5000)
    box.sent(b"b", None, 300)           # an untracked tail
    box.sent(b"b", t2, 700)             # tracked: covers the tail before it
    assert box.queued_total == 6000
    assert box.admit(b"a", ["frames"], 400) == HELD
    assert box.held_total == 400
    t1.done = True
    box.release(lambda f: None, lambda f: None, lambda f: None)
    assert box.held_total == 0 and box.queued_total == 1000
    t2.done = True
    box.sweep()
    assert box.queued_total == 0 and len(box) == 0
    assert box.queued_total == sum(c.queued for c in box._conns.values())


def test_a_quiet_untracked_tail_leaves_the_total_when_its_connection_is_forgotten(monkeypatch):
    box = Outbox(max_queued_bytes=1 << 20, hold_seconds=60)
    box.sent(b"a", None, 100)
    monkeypatch.setattr(outbox, "QUIET_SECONDS", 0.0)
    box.sweep()
    assert box.queued_total == 0


def test_a_connection_is_stuck_once_its_oldest_reply_waited_long_enough():
    box = Outbox(max_queued_bytes=1 << 20, hold_seconds=60)
    reading, stalled = Tracker(), Tracker()
    box.sent(b"reader", reading, 1 << 20)
    box.sent(b"stalled", stalled, 2 << 20)
    box.admit(b"stalled", [], 10)
    box.note_fd(b"stalled", 17)
    reading.done = True
    assert box.stuck(3600.0) == []
    assert box.stuck(0.0) == [(b"stalled", 17, 2 << 20)]


def budget_over(queued=0, held=0, limit=1000 * BIG):
    box = Outbox(max_queued_bytes=1 << 40, hold_seconds=60)
    box.queued_total, box.held_total = queued, held
    return MemoryBudget(limit, box)


def test_requests_past_the_budget_do_not_fit():
    budget = budget_over(queued=900 * BIG)
    assert budget.fits(100 * BIG) and not budget.fits(100 * BIG + 1)
    assert budget.fits(SMALL_REQUEST)
    full = budget_over(queued=1000 * BIG)
    assert not full.fits(BIG) and not full.fits(1)      # small requests too, once replies fill it


def test_hook_held_requests_never_refuse_small_requests():
    budget = budget_over()
    budget.hook_held = 1000 * BIG
    assert budget.used() == 1000 * BIG
    assert budget.fits(SMALL_REQUEST)        # a handoff_done / migrate_abort frees them: it must get in
    assert not budget.fits(BIG)


@pytest.mark.slow_unit(reason="two full garbage collections of a test process holding torch and numba")
def test_a_hook_held_request_counts_until_its_frame_is_freed():
    budget = budget_over()
    frame = Frame()
    budget.hold(frame, 5000)
    budget.hold(Frame(), 7)          # freed at once: nothing left counted for it
    gc.collect()
    assert budget.hook_held == 5000
    del frame
    gc.collect()
    assert budget.hook_held == 0


def test_the_peak_and_the_stats_say_what_was_held():
    budget = budget_over(queued=300)
    budget.hook_held = 200
    budget.note_peak()
    budget.outbox.queued_total = 0
    stats = budget.stats()
    assert stats["budget_peak_bytes"] == 500 and stats["budget_used_bytes"] == 200
    assert stats["budget_held_bytes"] == 200 and stats["budget_bytes"] == 1000 * BIG


def test_the_busy_message_names_the_server_and_the_budget_variable():
    message = budget_over(queued=1000 * BIG).busy_message("server 3", BIG)
    assert message.startswith("server 3 is busy") and f"PARAMSHARD_MAX_SERVER_BYTES={1000 * BIG}" in message


def test_the_budget_defaults_to_a_few_largest_messages_and_must_hold_two():
    assert Limits().server_bytes == 4 * Limits().max_message_bytes
    assert Limits(max_message_bytes=1000).server_bytes == 4000
    assert Limits(max_message_bytes=1000, max_server_bytes=2000).server_bytes == 2000
    with pytest.raises(ConfigError, match="PARAMSHARD_MAX_SERVER_BYTES=1999: at least twice"):
        Limits(max_message_bytes=1000, max_server_bytes=1999)
    with pytest.raises(ConfigError, match="PARAMSHARD_MAX_SERVER_BYTES=-1"):
        Limits(max_server_bytes=-1)
    assert Limits(max_server_bytes=1 << 33).to_environ() == {"PARAMSHARD_MAX_SERVER_BYTES": str(1 << 33)}


def test_busy_requests_back_off_doubling_and_jittered_up_to_a_cap():
    for attempt in range(12):
        wait = busy.backoff(attempt)
        cap = min(busy.MAX_BACKOFF_S, busy.FIRST_BACKOFF_S * 2 ** attempt)
        assert cap / 2 <= wait <= cap


def test_busy_requests_come_due_in_order_and_keep_their_refusal_count(monkeypatch):
    monkeypatch.setattr(busy, "backoff", lambda attempt: 0.0 if attempt < 1 else 3600.0)
    waiting = BusyRequests()
    assert not waiting and waiting.next_ms() is None
    waiting.refused(7, slot=0, message="server 0 is busy: ... PARAMSHARD_MAX_SERVER_BYTES=64")
    assert waiting and waiting.next_ms() <= 1
    assert waiting.describe(7, 0).startswith("refused as busy 1 times, last: server 0 is busy")
    assert waiting.due() == [7] and not waiting
    waiting.refused(8, slot=0, message="again")     # the same slot, sent again under a new id
    assert waiting.due() == [] and waiting.describe(8, 0) == "refused as busy 2 times, last: again"
    assert waiting.next_ms() > 1000
