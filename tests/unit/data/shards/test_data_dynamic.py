"""DynamicShards (data/shards/dynamic.py) against a real in-process server 0, with fake trainers
that step by hand: every record once; a prefetching loop (one batch ahead) gets LATER
instead of waiting on its own report (async) and empty batches while others still read
(sync); the reports match the batches stepped."""
import types

import numpy as np
import pytest

from paramshard.data import DynamicShards, LibsvmReader
from paramshard.data.shards.dynamic import LATER
from paramshard.errors import ConfigError
from paramshard.server.core.in_process import LocalLinks
from paramshard.server.core.parameter_server import ParameterServer
from paramshard.server.elastic.shard_service import ShardService


class FakeTrainer:
    """What DynamicShards uses of a Trainer; ``step()`` sends the riders as StepClient does."""

    def __init__(self, links, trainer_id, mode):
        self.links, self.trainer_id, self.step_count = links, trainer_id, 0
        self.env = types.SimpleNamespace(mode=mode, timeout=20.0)
        self.steps = types.SimpleNamespace(riders=[])

    def step(self):
        requests = [r for rider in self.steps.riders for r in rider(self.step_count)]
        self.links.request_list(requests)
        self.step_count += 1


def setup(tmp_path, mode, trainers=2, rows=90, lengths=None):
    path = tmp_path / "d.svm"
    pad = lengths or (lambda i: "")
    path.write_text("".join(f"{i % 2} {i}:1{pad(i)}\n" for i in range(rows)))
    server = ParameterServer(0, None, trainers, mode=mode, timeout=5.0)
    fakes = [FakeTrainer(LocalLinks(server, 5.0), t, mode) for t in range(trainers)]
    loaders = [DynamicShards(LibsvmReader(path, 4), task_bytes=97, trainer=f) for f in fakes]
    return fakes, loaders


class Prefetching:
    """trainer.prefetching()'s order: the next batch is taken before the current one is stepped."""

    def __init__(self, trainer, loader):
        self.trainer, self.it = trainer, iter(loader)
        self.upcoming = next(self.it, None)
        self.trained, self.empty, self.later = [], 0, 0

    def step(self) -> bool:
        current = self.upcoming
        if current is None:
            return False
        self.upcoming = next(self.it, None)
        self.trainer.step()
        self.trained += current.ids[current.offsets[:-1]].tolist()     # each row's first id: its line
        self.empty += len(current) == 0
        while self.upcoming is LATER:
            self.later += 1
            self.upcoming = next(self.it, None)
        return True


@pytest.mark.timeout(20)
def test_async_a_prefetching_loop_gets_later_instead_of_waiting_on_its_own_report(tmp_path):
    """Alone, at the end of the pass: its last task is held by itself until the step of its
    last batch reports it done; the loader says LATER, the step goes out, then finished."""
    [fake], [loader] = setup(tmp_path, "async", trainers=1)
    loop = Prefetching(fake, loader)
    while loop.step():
        pass
    assert sorted(loop.trained) == list(range(90))
    assert loop.later >= 1 and loop.empty == 0
    queue = fake.links.server.service(ShardService).queue
    assert queue.finished and not queue.owner
    assert queue.reported[0] == fake.step_count - 1


@pytest.mark.timeout(20)
def test_sync_loops_get_empty_batches_and_finish_at_the_same_step(tmp_path):
    # Lines 0-29 are long: the first tasks hold few records, so one trainer reads far more.
    fakes, loaders = setup(tmp_path, "sync", lengths=lambda i: " 7:1" * 40 if i < 30 else "")
    loops = [Prefetching(f, d) for f, d in zip(fakes, loaders)]
    while True:
        going = [loop.step() for loop in loops]        # lockstep, as sync steps are
        assert going[0] == going[1], "the pass ended at different steps"
        if not going[0]:
            break
    rows = [i for loop in loops for i in loop.trained]
    assert sorted(rows) == list(range(90))
    assert fakes[0].step_count == fakes[1].step_count and max(loop.empty for loop in loops) > 0


def test_collective_mode_and_other_loaders_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="read_task"):
        DynamicShards([np.zeros(3)])
    path = tmp_path / "d.svm"
    path.write_text("1 1:1\n")
    trainer = types.SimpleNamespace(steps=None, links=None)
    with pytest.raises(ConfigError, match="collective mode"):
        iter(DynamicShards(LibsvmReader(path, 4), trainer=trainer))


def test_an_async_trainer_waiting_for_tasks_held_elsewhere_gives_up_only_when_nobody_progresses():
    from paramshard.client.shards import Waiting
    from paramshard.data.shards.dynamic import _Stuck, stuck_after
    from paramshard.errors import DeadlineExceeded

    now = [0.0]
    stuck = _Stuck(lambda: now[0], stuck_after(3.0))
    assert stuck.after == 11.0
    for t, mark in [(0, 5), (10, 5), (11, 6), (21, 6)]:      # the holder's report at 11 restarts the clock
        now[0] = t
        stuck.check(Waiting((2,), mark), me=0)
    now[0] = 22.5
    with pytest.raises(DeadlineExceeded, match=r"trainer 0 has had no data task for 12 s.*trainers \[2\]"):
        stuck.check(Waiting((2,), 6), me=0)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_plain_loop_goes_on_through_a_rollback_and_reads_every_record_once(tmp_path, mode):
    """Issue 29 leftover: a rollback (client/recovery.py: the chief resets the servers, restores the
    checkpoint's queue; every trainer goes back to the checkpoint's step) under a plain ``for batch
    in loader`` loop (elastic_matrix with prefetch off), which is not re-opened. Before, the loader
    went on reading the task it held before the rollback and the next step's report named it: the
    restored queue no longer gave it to this trainer and refused the report, failing the trainer
    ("reported task N, which it does not hold"). Now the loader drops what it held when the trainer
    rolled back and asks the restored queue again. Oracle: the steps of the final timeline (those
    before the checkpoint, then the replayed ones) trained every record exactly once."""
    from paramshard.client import shards
    rows, save_at, fail_at = 90, 4, 9
    (fake,), (loader,) = setup(tmp_path, mode, trainers=1, rows=rows)
    fake.recoveries = 0
    trained = {}        # step -> the records its batch trained (a replayed step replaces the old)
    saved = None
    for batch in loader:
        step = fake.step_count
        if step == fail_at and saved is not None:
            # The push of this step fails (a server died): the rollback, as client/recovery.py does it.
            server = fake.links.server
            fake.links.epoch += 1
            server.handle_local({"op": "reset", "epoch": fake.links.epoch, "trainer": 0}, [])
            shards.restore(fake.links, saved)
            fake.step_count, fake.recoveries = save_at, fake.recoveries + 1
            saved = None
            continue        # the failed step trained nothing
        fake.step()
        trained[step] = batch.ids[batch.offsets[:-1]].tolist()
        if fake.step_count == save_at:          # a checkpoint after step save_at - 1
            saved = shards.snapshot(fake.links, mode, 1, save_at, {0: save_at - 1} if mode == "async" else None)
    assert fake.recoveries == 1
    ids = [i for step in sorted(trained) for i in trained[step]]
    assert sorted(ids) == list(range(rows)), (len(ids), len(set(ids)))


def test_a_loader_finds_no_trainer_by_itself_it_is_handed_one(tmp_path):
    """No process global: without ``trainer=`` a loader iterated by hand says how to give it one;
    ``trainer.prefetching(loader)`` binds its own (``bind``), and a loader given one Trainer
    refuses another."""
    path = tmp_path / "d.svm"
    path.write_text("1 1:1\n")
    loader = DynamicShards(LibsvmReader(path, 4))
    with pytest.raises(ConfigError, match=r"trainer=trainer\), or iterate it through trainer.prefetching"):
        iter(loader)
    mine, other = types.SimpleNamespace(steps=None, links=None), types.SimpleNamespace(steps=None, links=None)
    loader.bind(mine)
    loader.bind(mine)           # the same trainer again (the next epoch's prefetching): fine
    assert loader.trainer is mine
    with pytest.raises(ConfigError, match="another Trainer"):
        loader.bind(other)
    with pytest.raises(ConfigError, match="another Trainer"):
        DynamicShards(LibsvmReader(path, 4), trainer=mine).bind(other)


def test_data_does_not_import_the_trainer_package():
    import pathlib

    import paramshard.data
    root = pathlib.Path(paramshard.data.__file__).parent
    upward = [f"{p.relative_to(root)}:{n}" for p in sorted(root.rglob("*.py"))
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if "paramshard.trainer" in line or "paramshard.torch" in line]
    assert upward == []
