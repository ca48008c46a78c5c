"""server/services/trainer_barrier.py across a rollback or resume: the counts start again where the trainers'
checkpoint left them, on a server 0 that kept its barriers and on one that knows none."""
import pytest

from paramshard.errors import ConfigError
from paramshard.server.core.barrier import Membership
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.services.trainer_barrier import TrainerBarriers


def enter(barriers, trainer, count, name="epoch-end", resumed=False):
    header = {"trainer": trainer, "name": name, "count": count}
    if resumed:
        header["resumed"] = True
    return barriers.handle_barrier(header, [])


def passed(outcome) -> bool:
    return isinstance(outcome, Reply) or (isinstance(outcome, Deferred) and outcome.ready())


def two_trainers():
    membership = Membership(2, grace=5.0)
    membership.note_request(0), membership.note_request(1)
    return TrainerBarriers(0, membership)


@pytest.mark.parametrize("restarted", [False, True])
def test_after_a_reset_the_trainers_enter_at_their_checkpoint_counts(restarted):
    barriers = two_trainers()
    if not restarted:                      # server 0 lived through it: it had counted to #2
        for count in (1, 2):
            first = enter(barriers, 0, count)
            assert passed(enter(barriers, 1, count)) and passed(first)
        barriers.reset()
    # The checkpoint was taken after #1: both go back there and enter #2 again.
    waiting = enter(barriers, 0, 2, resumed=True)
    assert not passed(waiting)
    assert passed(enter(barriers, 1, 2, resumed=True)) and passed(waiting)
    # From the second entry on, the usual rules.
    with pytest.raises(ConfigError, match="skipped one"):
        enter(barriers, 0, 4)
    assert not passed(enter(barriers, 0, 3))


def test_a_first_entry_must_be_number_one_unless_its_count_comes_from_a_checkpoint():
    with pytest.raises(ConfigError, match="the last it entered is #0"):
        enter(two_trainers(), 1, 2)


def test_resumed_counts_only_set_a_trainers_first_entry():
    barriers = two_trainers()
    enter(barriers, 0, 5, resumed=True)
    with pytest.raises(ConfigError, match="skipped one"):
        enter(barriers, 0, 7, resumed=True)


def test_a_reset_voids_a_half_complete_barrier():
    barriers = two_trainers()
    enter(barriers, 0, 1)
    barriers.reset()
    assert barriers.stats()["barriers"] == {"names": 0, "waiting": {}}
