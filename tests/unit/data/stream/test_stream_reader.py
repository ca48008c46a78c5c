"""StreamReader: the position a checkpoint saves is the one after the batch its step trained
(never one read ahead); resume and rollback seek it, so every record is trained once."""
from types import SimpleNamespace

import pytest

from paramshard.data import DirectoryStream, StreamReader
from paramshard.errors import ConfigError
from tests.unit.data.stream.stream_files import append, ids_of, jsonl_rows


class FakeTrainer:
    """What StreamReader reads of a Trainer: its progress, step count, rollbacks and mode."""

    def __init__(self, mode="async", position=None, step=0):
        self.trainer_id, self.leave_requested, self.recoveries = 0, False, 0
        self.env = SimpleNamespace(mode=mode)
        self.progress = SimpleNamespace(stream=None, position=position or {})
        self.step_count = step

    def step(self):
        self.step_count += 1

    def checkpoint(self):
        """What trainer/checkpointing.py does: the position at this step, then saved()."""
        position = self.progress.stream.position_at(self.step_count)
        self.progress.stream.saved(position)
        return position

    def roll_back(self, step, position):
        self.step_count, self.recoveries = step, self.recoveries + 1
        self.progress.position = {"stream": position}


def reader_on(tmp_path, trainer, batch=2, **options):
    return StreamReader(DirectoryStream(tmp_path), trainer, batch, poll_timeout=0.01, **options)


def test_a_checkpoint_saves_the_trained_batch_position_not_the_one_read_ahead(tmp_path):
    append(tmp_path / "a.jsonl", jsonl_rows(range(10)))
    trainer = FakeTrainer()
    reader = reader_on(tmp_path, trainer)
    assert trainer.progress.stream is reader
    batches = iter(reader)
    current = next(batches)
    ahead = next(batches)                        # a prefetching loop reads the next one first
    trainer.step()                               # trains `current`
    saved = trainer.checkpoint()
    assert saved == current.position != ahead.position
    assert saved["files"]["a.jsonl"]["records"] == 2
    assert trainer.checkpoint() == saved         # the same step saved again: the same position


def test_a_rollback_trains_the_records_after_the_checkpoint_again(tmp_path):
    append(tmp_path / "a.jsonl", jsonl_rows(range(12)))
    trainer = FakeTrainer()
    reader = reader_on(tmp_path, trainer)
    trained = []
    batches = iter(reader)
    for _ in range(2):
        trained.append(ids_of(next(batches)))
        trainer.step()
    saved = trainer.checkpoint()                 # step 2: records 0..3
    for _ in range(2):
        trained.append(ids_of(next(batches)))    # steps 3, 4: records 4..7, lost with the failure
        trainer.step()
    trainer.roll_back(2, saved)
    again = [ids_of(next(batches)) for _ in range(2)]
    assert again == trained[2:4]                 # the same records, none skipped
    trainer.step()
    assert trainer.checkpoint()["files"]["a.jsonl"]["records"] == 6


def test_a_resumed_reader_goes_on_after_the_checkpoint(tmp_path):
    append(tmp_path / "a.jsonl", jsonl_rows(range(9)))
    first = FakeTrainer()
    batches = iter(reader_on(tmp_path, first, batch=4))
    next(batches)
    first.step()
    saved = first.checkpoint()
    resumed = FakeTrainer(position={"stream": saved}, step=1)
    reader = reader_on(tmp_path, resumed, batch=4, idle_timeout=0)
    assert [i for batch in reader for i in ids_of(batch)] == [4, 5, 6, 7, 8]


def test_the_loop_ends_on_stop_and_when_idle_and_steps_when_sync(tmp_path):
    trainer = FakeTrainer(mode="sync")
    reader = reader_on(tmp_path, trainer)
    batches = iter(reader)
    empty = next(batches)                          # sync: no record yet is an empty batch to step on
    assert len(empty.records) == 0 and empty.position == reader.source.position()
    append(tmp_path / "a.jsonl", jsonl_rows(range(3)))
    assert ids_of(next(batches)) == [0, 1]
    reader.stop()
    assert next(batches, None) is None
    idle = reader_on(tmp_path, FakeTrainer(mode="async"), idle_timeout=0.05)
    assert [ids_of(b) for b in idle] == [[0, 1], [2]]     # async: no empty batches; ends once idle


def test_one_reader_per_trainer_and_a_rollback_without_a_position_is_refused(tmp_path):
    trainer = FakeTrainer()
    reader = reader_on(tmp_path, trainer)
    with pytest.raises(ConfigError, match="already reads a StreamReader"):
        reader_on(tmp_path, trainer)
    trainer.step_count, trainer.recoveries = 3, 1
    with pytest.raises(ConfigError, match="rolled back at step 3, but its checkpoint holds no stream position"):
        next(iter(reader))
    with pytest.raises(ConfigError, match="resumes at step 3, but its checkpoint holds no stream position"):
        reader_on(tmp_path, FakeTrainer(step=3))


class ProgressTrainer:
    """A Trainer's parts StreamReader uses, over a real TrainerProgress (trainer/progress.py)."""

    def __init__(self):
        from paramshard.client.recovery import RecoveryPolicy
        from paramshard.trainer.progress import TrainerProgress
        self.trainer_id, self.leave_requested, self.env = 0, False, SimpleNamespace(mode="async")
        self.progress = TrainerProgress(0, RecoveryPolicy(1, "/ckpt"))

    step_count = property(lambda self: self.progress.step)
    recoveries = property(lambda self: self.progress.recoveries)


def test_a_trainer_progress_rollback_reads_the_checkpoint_records_again(tmp_path):
    from paramshard.errors import ServerUnavailable
    from paramshard.trainer.position import capture
    append(tmp_path / "a.jsonl", jsonl_rows(range(10)))
    trainer = ProgressTrainer()
    reader = reader_on(tmp_path, trainer)
    batches = iter(reader)
    next(batches)
    trainer.progress.advance()
    saved = {**capture(1), "stream": reader.position_at(1)}          # trainer/checkpointing.py's file
    trained_after = [ids_of(next(batches)) for _ in range(2)]
    trainer.progress.advance(), trainer.progress.advance()
    checkpoint = SimpleNamespace(step=1, trainer_position=lambda tid: saved)
    trainer.progress.restore_with(lambda: (checkpoint, None))
    trainer.progress.roll_back(ServerUnavailable("server 0 restarted"))
    assert trainer.step_count == 1
    assert [ids_of(next(batches)) for _ in range(2)] == trained_after
