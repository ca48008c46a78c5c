"""trainer/loop.py: where a trainer is in its data, and how a loader is put back there."""
import pytest

from paramshard.errors import ConfigError
from paramshard.trainer.loop import LoopPosition


class Reader:
    """A loader with state()/restore() like TabularReader: its pass number changes its order."""

    def __init__(self, n=6):
        self.n, self.epoch, self.batches, self._skip = n, 0, 0, 0
        self.restored = []

    def state(self):
        return {"epoch": self.epoch, "batches": self.batches}

    def restore(self, state):
        self.restored.append(dict(state))
        self.epoch, self._skip = state["epoch"] - 1, state["batches"]

    def __iter__(self):
        self.epoch += 1
        skip, self._skip = self._skip, 0
        return iter([(self.epoch, b) for b in range(skip, self.n)])


def test_a_plain_iterable_is_iterated_again_and_the_trained_batches_skipped():
    loop = LoopPosition()
    assert list(loop.batches([10, 11, 12, 13], step=7, barrier_counts={})) == [10, 11, 12, 13]
    assert loop.start_step == 7
    # A rollback to step 9: the pass goes on from its third batch.
    assert list(loop.batches([10, 11, 12, 13], step=9, barrier_counts={})) == [12, 13]


def test_a_rollback_before_the_start_of_the_pass_is_an_error_that_says_what_to_use():
    loop = LoopPosition()
    list(loop.batches([1, 2], step=5, barrier_counts={}))
    with pytest.raises(ConfigError, match="trainer.epochs"):
        loop.batches([1, 2], step=3, barrier_counts={})


def test_outside_epochs_a_finished_pass_starts_the_next_one_afresh():
    loop = LoopPosition()
    list(loop.batches([1, 2], step=0, barrier_counts={}))
    loop.pass_ended()
    assert list(loop.batches([1, 2], step=2, barrier_counts={})) == [1, 2]


def test_in_epochs_a_positionable_loader_takes_the_epoch_as_its_pass_and_is_restored_at_the_batch():
    loop, reader = LoopPosition(), Reader()
    loop.begin_epoch(3, step=40, barrier_counts={"epoch-end": 2})
    assert list(loop.batches(reader, step=40, barrier_counts={}))[:2] == [(3, 0), (3, 1)]
    assert reader.restored == [{"epoch": 3, "batches": 0}]
    loop.pass_ended()          # inside epochs() the position stays: a rollback after the loop replays it
    assert loop.start_step == 40
    assert list(loop.batches(reader, step=44, barrier_counts={})) == [(3, 4), (3, 5)]
    assert reader.restored[-1] == {"epoch": 3, "batches": 4}


def test_the_saved_position_brings_a_new_process_back_to_the_same_batch_and_barrier_counts():
    loop = LoopPosition()
    loop.begin_epoch(2, step=10, barrier_counts={"epoch-end": 1})
    list(loop.batches(Reader(), step=10, barrier_counts={}))
    saved = loop.as_json(step=13, barrier_counts={"epoch-end": 1, "inner": 4})
    assert saved == {"epoch": 2, "batch": 3, "loader_pass": 2, "barrier_counts": {"epoch-end": 1, "inner": 4}}

    resumed, reader = LoopPosition(), Reader()
    resumed.load(saved, step=13)
    assert (resumed.epoch, resumed.start_step, resumed.barrier_counts) == (2, 10, {"epoch-end": 1, "inner": 4})
    assert list(resumed.batches(reader, step=13, barrier_counts={})) == [(2, 3), (2, 4), (2, 5)]


@pytest.mark.parametrize("saved", [{"epoch": 1}, {"epoch": "1", "batch": 0}, {"epoch": 1, "batch": -1},
                                   {"epoch": 1, "batch": 0, "barrier_counts": {"a": "x"}}, {"batch": 0, "loader_pass": 1.5}])
def test_a_malformed_saved_position_is_a_config_error(saved):
    with pytest.raises(ConfigError, match="loop position"):
        LoopPosition().load(saved, step=5)


def test_no_position_is_saved_when_no_loop_is_in_use():
    assert LoopPosition().as_json(step=3, barrier_counts={}) is None
