"""server/services/trainer_barrier.py as a broadcast: trainer 0's value reaches every trainer's reply for
that count, retries included; what is kept stays bounded; bad values leave no trace.
(Rollbacks and resumed counts of plain barriers: test_trainer_barrier_rebase.py.)"""
import pytest

from paramshard import json_value
from paramshard.errors import ConfigError, LimitExceeded
from paramshard.server.services import trainer_barrier
from paramshard.server.core.barrier import Membership
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.services.trainer_barrier import TrainerBarriers

NO = object()


def barriers_of(trainers=3):
    membership = Membership(trainers, grace=5.0)
    for t in range(trainers):
        membership.note_request(t)
    return TrainerBarriers(0, membership)


def enter(barriers, trainer, count, value=NO, name="decide", resumed=False, broadcast=True):
    header = {"trainer": trainer, "name": name, "count": count}
    if broadcast:
        header["broadcast"] = True
    if value is not NO:
        header["value"] = value
    if resumed:
        header["resumed"] = True
    return barriers.handle_barrier(header, [])


def reply_of(outcome) -> dict:
    if isinstance(outcome, Deferred):
        assert outcome.ready(), outcome.describe()
        outcome = outcome.make_reply()
    assert isinstance(outcome, Reply)
    return outcome.fields


def kept(barriers, name="decide") -> dict:
    return {count: value for count, (value, _) in barriers.barriers[name].values.items()}


@pytest.mark.parametrize("chief_first", [True, False])
def test_every_trainer_gets_the_chiefs_value(chief_first):
    barriers = barriers_of()
    value = {"stop": False, "decay": True, "auc": 0.7812, "why": ["plateau", 3], "none": None}
    order = [0, 1, 2] if chief_first else [1, 2, 0]
    outcomes = {t: enter(barriers, t, 1, value if t == 0 else NO) for t in order}
    assert not any(isinstance(o, Reply) for t, o in outcomes.items() if t != order[-1])   # nobody passed early
    for t in range(3):
        assert reply_of(outcomes[t]) == {"name": "decide", "count": 1, "value": value}


def test_a_retry_of_a_completed_count_gets_that_counts_value_after_the_chief_moved_on():
    barriers = barriers_of(2)
    first = [enter(barriers, 0, 1, "one"), enter(barriers, 1, 1)]
    assert [reply_of(o)["value"] for o in first] == ["one", "one"]
    waiting = enter(barriers, 0, 2, "two")             # the chief is in #2 already
    assert reply_of(enter(barriers, 1, 1))["value"] == "one"     # trainer 1's reply for #1 was lost: it asks again
    assert not enter(barriers, 0, 2, "changed").ready()       # the chief's retry of #2
    assert kept(barriers) == {1: "one", 2: "two"}      # a chief's retry keeps the first entry's value
    assert reply_of(enter(barriers, 1, 2))["value"] == "two" and reply_of(waiting)["value"] == "two"


def test_only_the_latest_completed_count_and_the_next_are_kept():
    barriers = barriers_of(2)
    for count in range(1, 30):
        enter(barriers, 0, count, {"n": count, "pad": "x" * count})
        assert reply_of(enter(barriers, 1, count))["value"]["n"] == count
        assert list(kept(barriers)) == [count]
    enter(barriers, 0, 30, {"n": 30})
    assert list(kept(barriers)) == [29, 30]
    sizes = sum(len(json_value.encoded(v)) for v in kept(barriers).values())
    assert barriers.stored_bytes == sizes
    barriers.reset()                                   # a rollback forgets values with the barriers
    assert barriers.stored_bytes == 0 and barriers.barriers == {}


def test_after_a_reset_resumed_entries_broadcast_at_their_checkpoint_counts():
    barriers = barriers_of(2)
    for count in (1, 2):
        enter(barriers, 0, count, count), enter(barriers, 1, count)
    barriers.reset()
    later = enter(barriers, 1, 2, resumed=True)        # the checkpoint was after #1: #2 again
    assert not reply_of_ready(later)
    assert reply_of(enter(barriers, 0, 2, "again", resumed=True))["value"] == "again"
    assert reply_of(later)["value"] == "again"


def reply_of_ready(outcome) -> bool:
    return isinstance(outcome, Reply) or outcome.ready()


def test_a_chief_that_left_without_broadcasting_fails_the_others_wait():
    barriers = barriers_of(2)
    waiting = enter(barriers, 1, 1)
    barriers.membership.leave(0)
    barriers.on_leave(0)
    assert waiting.ready()
    with pytest.raises(ConfigError, match="trainer 0 left the job without entering it"):
        waiting.make_reply()


BAD = [   # (trainer, value or NO, part of the message)
    (0, NO, "without the value it broadcasts"),
    (1, "mine", "only trainer 0's entry does"),
    (0, float("nan"), "not a finite number"),
    (0, {"w": [1.0, float("inf")]}, "value['w'][1] = inf"),
    (0, "x" * (json_value.MAX_BYTES + 1), "more than the 65536 allowed"),
    (0, 1 << 70, "does not fit in 64 bits"),
    (0, {1: "a"}, "JSON keys are strings"),
    (0, (1, 2), "use a list"),
    (0, {1, 2}, "is a set"),
]


@pytest.mark.parametrize("trainer,value,message", BAD, ids=[m for _, _, m in BAD])
def test_a_bad_value_is_refused_and_leaves_no_trace(trainer, value, message):
    barriers = barriers_of(2)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        enter(barriers, trainer, 1, value)
    assert barriers.barriers == {} and barriers.stored_bytes == 0


def test_a_name_is_a_barrier_or_a_broadcast_not_both():
    barriers = barriers_of(2)
    enter(barriers, 0, 1, broadcast=False, name="epoch")
    with pytest.raises(ConfigError, match="'epoch' is a barrier name: give trainer.broadcast another name"):
        enter(barriers, 1, 1, name="epoch")
    with pytest.raises(ConfigError, match="only a broadcast's entries do"):
        enter(barriers, 1, 1, "v", name="epoch", broadcast=False)
    enter(barriers, 0, 1, 5, name="decide")
    with pytest.raises(ConfigError, match="is a broadcast name: give trainer.barrier another name"):
        enter(barriers, 1, 1, name="decide", broadcast=False)


def test_the_values_kept_over_every_name_are_bounded(monkeypatch):
    monkeypatch.setattr(trainer_barrier, "MAX_STORED_BYTES", 100)
    barriers = barriers_of(2)
    enter(barriers, 0, 1, "a" * 60, name="one")
    with pytest.raises(LimitExceeded, match="would pass 100 bytes"):
        enter(barriers, 0, 1, "b" * 60, name="two")
    assert "two" not in barriers.barriers and barriers.stored_bytes == 62


# -- a trainer that joins an elastic job goes on at the job's counts (docs/elastic.md) --------------

def elastic_barriers(trainers=3, live=(0, 1)):
    membership = Membership(trainers, grace=5.0, min_trainers=1)
    for t in range(trainers):
        if t in live:
            membership.note_request(t)
        else:
            membership.connection_lost(t)     # an empty slot, as a scale-up finds it
    return TrainerBarriers(0, membership)


def join(barriers, trainer):
    barriers.membership.join(trainer, first_step=10)
    barriers.on_leave(trainer)          # the join's order (server/core/control_handlers.py)
    return barriers.on_join(trainer)["barrier_counts"]


def test_a_joiner_goes_on_at_the_completed_count_and_is_waited_for_from_the_next():
    barriers = elastic_barriers()
    for count in (1, 2):
        for t in (0, 1):
            enter(barriers, t, count, "v" if t == 0 else NO, name="selection")
            enter(barriers, t, count, name="epoch-end", broadcast=False)
    assert join(barriers, 2) == {"selection": 2, "epoch-end": 2}
    # Its next entry is #3, like everyone's (from zero it entered #1: "trainer 0 left the job
    # without entering it", or a count the others passed long ago), and #3 waits for it.
    outcomes = [enter(barriers, t, 3, name="epoch-end", broadcast=False) for t in (0, 1)]
    assert all(isinstance(o, Deferred) and not o.ready() for o in outcomes)
    assert outcomes[0].waits_on() == [2]
    assert reply_of(enter(barriers, 2, 3, name="epoch-end", broadcast=False)) == {"name": "epoch-end", "count": 3}
    assert all(o.ready() for o in outcomes)
    decided = [enter(barriers, 2, 3, name="selection"), enter(barriers, 1, 3, name="selection")]
    assert not any(o.ready() for o in decided)           # the chief's value is not there yet
    enter(barriers, 0, 3, "three", name="selection")
    assert [reply_of(o)["value"] for o in decided] == ["three", "three"]


def test_a_count_in_progress_at_the_join_completes_without_the_joiner_which_may_enter_it():
    barriers = elastic_barriers()
    for t in (0, 1):
        enter(barriers, t, 1, "one" if t == 0 else NO)
    waiting = enter(barriers, 0, 2, "two")              # the chief is in #2 already, trainer 1 not
    assert join(barriers, 2) == {"decide": 1}
    late = enter(barriers, 2, 2)                        # the joiner enters #2 too: it waits as the others do
    assert isinstance(late, Deferred) and late.waits_on() == [1]     # for trainer 1, not for itself
    enter(barriers, 1, 2)
    assert reply_of(waiting)["value"] == reply_of(late)["value"] == "two"
    # A joiner that skips the count in progress is not waited for there either.
    barriers = elastic_barriers()
    enter(barriers, 0, 1, "one")
    join(barriers, 2)
    assert reply_of(enter(barriers, 1, 1)) == {"name": "decide", "count": 1, "value": "one"}
    third = enter(barriers, 0, 2, "two")
    enter(barriers, 1, 2)
    assert not third.ready() and third.waits_on() == [2]       # from #2 on it is required


def test_a_joiner_of_a_slot_whose_last_process_left_starts_afresh_and_names_new_barriers_from_zero():
    barriers = elastic_barriers(live=(0, 1, 2))
    for t in (0, 1, 2):
        enter(barriers, t, 1, name="x", broadcast=False)
    barriers.membership.leave(2)
    barriers.on_leave(2)
    for t in (0, 1):
        enter(barriers, t, 2, name="x", broadcast=False)
    assert join(barriers, 2) == {"x": 2}
    outcome = enter(barriers, 2, 1, name="new", broadcast=False)
    assert isinstance(outcome, Deferred) and outcome.waits_on() == [0, 1]
