"""The stream's position with the checkpoints (apps/ctr/stream_position.py): the position after a
batch is in the trainer's state before its step (so the checkpoint that step writes holds it), a
resume and a rollback seek the source back to the checkpoint's position, and a written checkpoint
commits its position once."""
from types import SimpleNamespace

from paramshard.apps.ctr.stream_position import KEY, StreamPosition


class Source:
    def __init__(self):
        self.at, self.seeks, self.commits = {"row": 0}, [], []

    def position(self):
        return dict(self.at)

    def seek(self, position):
        self.seeks.append(position)

    def commit(self, position):
        self.commits.append(position)


def trainer(state=None, checkpoints=True):
    return SimpleNamespace(state=state or {}, recoveries=0, env=SimpleNamespace(checkpoint_dir="ck" if checkpoints
                                                                                 else None),
                           progress=SimpleNamespace(unsaved=True))


def test_a_new_job_starts_where_the_source_is_and_a_resume_seeks_the_checkpoints_position():
    source = Source()
    assert StreamPosition(trainer(), source).resume() == 0 and source.seeks == []
    t = trainer({KEY: {"position": {"row": 40}, "events": 40}})
    assert StreamPosition(t, source).resume() == 40 and source.seeks == [{"row": 40}]


def test_a_checkpoint_commits_its_position_once_and_a_rollback_seeks_back():
    source, t = Source(), trainer()
    p = StreamPosition(t, source)
    p.trained({"row": 10}, 10)
    assert t.state[KEY] == {"position": {"row": 10}, "events": 10}
    assert p.after_step() is None and source.commits == []        # no checkpoint at this step
    p.trained({"row": 20}, 20)
    t.progress.unsaved = False                                      # this step wrote one
    assert p.after_step() is None and source.commits == [{"row": 20}]
    p.commit()
    assert source.commits == [{"row": 20}]                           # once
    t.progress.unsaved = True
    p.trained({"row": 30}, 30)
    t.recoveries, t.state = 1, {KEY: {"position": {"row": 20}, "events": 20}}    # rolled back to that checkpoint
    assert p.after_step() == 20 and source.seeks == [{"row": 20}]


def test_a_rollback_before_any_checkpoint_goes_back_to_the_start():
    source, t = Source(), trainer()
    p = StreamPosition(t, source)
    p.trained({"row": 10}, 10)
    t.recoveries, t.state = 1, {}
    assert p.after_step() == 0 and source.seeks == [{"row": 0}]


def test_without_checkpoints_nothing_is_committed():
    source, t = Source(), trainer(checkpoints=False)
    p = StreamPosition(t, source)
    p.trained({"row": 10}, 10)
    t.progress.unsaved = False
    assert p.after_step() is None and source.commits == []
    p.commit()
    assert source.commits == []
