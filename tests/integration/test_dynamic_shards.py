"""Dynamic data shards with real server processes: every record trained exactly once per
pass whatever joins or leaves, and a resumed job continues the task queue exactly.

The data is libsvm lines ``label id:1`` whose id is the line number, so the ids a
trainer's batches carry name the records it trained; every trainer logs them per step.
Oracle: the logs of all trainers together hold every id exactly once (the count check).
"""
import io
import os
import signal
import sys
import textwrap
import time

import pytest

from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.processes import Child

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

ROWS, BATCH, TASK_BYTES = 1000, 4, 300

TRAINER = textwrap.dedent("""
    import faulthandler, sys, time, torch, torch.nn as nn
    import paramshard as ps
    faulthandler.dump_traceback_later(25, exit=True)     # a hang shows where it is
    from paramshard.data import DynamicShards, LibsvmReader
    data, log_path, stop_after, pause, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    end = time.monotonic() + 30
    while go and not __import__("os").path.exists(go):     # a late joiner: connects only once told to
        assert time.monotonic() < end, "never told to join"
        time.sleep(0.02)
    ps.init()
    model = nn.Linear(1, 1)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.01))
    loader = DynamicShards(LibsvmReader(data, %(batch)d), task_bytes=%(task_bytes)d)
    with open(log_path, "a") as log:
        for epoch in trainer.epochs(1):
            for batch in trainer.prefetching(loader):
                x = torch.from_numpy(batch.labels).view(-1, 1)
                trainer.step(model(x).sum() if len(batch) else None)
                log.write(" ".join(str(i) for i in batch.ids.tolist()) + "\\n")
                log.flush()
                time.sleep(pause)
                if trainer.step_count == stop_after:
                    trainer.backend.flush()      # every step's push and report answered
                    print("ready", flush=True)
                    time.sleep(120)              # killed here, between steps
    trainer.close()
    print("done", flush=True)
""" % {"batch": BATCH, "task_bytes": TASK_BYTES})


def write_data(path, rows=ROWS):
    path.write_text("".join(f"{i % 2} {i}:1\n" for i in range(rows)))
    return path


def logged_ids(paths):
    ids = []
    for p in paths:
        if p.exists():
            ids += [int(x) for line in p.read_text().splitlines() for x in line.split()]
    return ids


def start(c, slot, script, data, log, stop_after=-1, pause=0.02, out=None, go="", **env):
    environ = child_environ(c.trainer_env(slot, **env))
    return Child(f"trainer {slot}", [sys.executable, str(script), str(data), str(log), str(stop_after), str(pause),
                                     str(go)], environ, out if out is not None else io.StringIO())


def wait_for(predicate, what, seconds=30):
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_a_killed_trainer_and_a_late_one_every_record_once(cluster, tmp_path):
    c = cluster(servers=1, trainers=4, mode="async", timeout=3.0)
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    data = write_data(tmp_path / "d.svm")
    logs = [tmp_path / f"ids{t}.txt" for t in range(4)]
    outs = [io.StringIO() for _ in range(4)]
    children = {}
    try:
        go = tmp_path / "go"
        for t in (0, 1, 2):
            children[t] = start(c, t, script, data, logs[t], stop_after=15 if t == 1 else -1, out=outs[t])
        # Slot 3's process starts now (Python and torch take seconds to load) and joins when told.
        children[3] = start(c, 3, script, data, logs[3], out=outs[3], go=go)
        wait_for(lambda: "ready" in outs[1].getvalue() or children[1].poll() is not None, "trainer 1 to stop")
        assert children[1].poll() is None, outs[1].getvalue()
        assert not logged_ids([logs[3]])
        go.touch()                                      # another slot joins mid-epoch
        os.kill(children[1].pid, signal.SIGKILL)        # mid-epoch, holding tasks
        children[1].proc.wait(5)
        for t in (0, 2, 3):
            children[t].proc.wait(30)
            assert children[t].proc.returncode == 0, outs[t].getvalue()
    finally:
        for child in children.values():
            child.stop(grace=1)
    ids = logged_ids(logs)
    assert sorted(ids) == list(range(ROWS)), (len(ids), len(set(ids)))
    assert len(logs[1].read_text().splitlines()) == 15     # the killed one's steps before it died
    assert logged_ids([logs[3]]), "the late trainer took a share"


def train_in_thread(c, t, data, steps_log, task_bytes, save_at=None, ckpt=None, resume=None):
    """One trainer of ``c`` (a thread of this process, its own links): logs (step, ids) per step."""
    import torch
    import torch.nn as nn

    import paramshard as ps
    from paramshard.data import DynamicShards, LibsvmReader
    from paramshard.trainer.trainer import Trainer
    model = nn.Linear(1, 1)
    trainer = Trainer(model, ps.optim.SGD(lr=0.01), env=c.trainer_env(t), resume=resume)
    loader = DynamicShards(LibsvmReader(data, BATCH), task_bytes=task_bytes, trainer=trainer)
    for _ in trainer.epochs(1):
        for batch in trainer.prefetching(loader):
            step = trainer.step_count
            x = torch.from_numpy(batch.labels).view(-1, 1)
            trainer.step(model(x).sum() if len(batch) else None)
            steps_log.append((step, batch.ids[batch.offsets[:-1]].tolist()))     # each row's first id: its line
            if trainer.step_count == save_at:
                trainer.save(ckpt)
    final = trainer.step_count
    trainer.close()
    return final


def uneven_data(path, rows=400):
    """Lines of very different lengths: tasks of one byte size hold very different record counts."""
    pad = " 1000000:1" * 30
    path.write_text("".join(f"{i % 2} {i}:1" + (pad if (i // 40) % 2 else "") + "\n" for i in range(rows)))
    return path


@pytest.mark.timeout(60)
def test_sync_trainers_run_out_at_different_times_and_end_the_pass_at_the_same_step(cluster, tmp_path):
    from tests.conftest import run_in_threads
    c = cluster(servers=1, trainers=2, mode="sync", timeout=10.0)
    data = uneven_data(tmp_path / "d.svm")
    logs, finals = [[], []], [None, None]

    def run(t):
        finals[t] = train_in_thread(c, t, data, logs[t], task_bytes=2000)
    run_in_threads([lambda t=t: run(t) for t in range(2)], timeout=50)
    ids = [i for log in logs for _, batch in log for i in batch]
    assert sorted(ids) == list(range(400))
    assert finals[0] == finals[1] == len(logs[0]) == len(logs[1])       # every step taken by both
    empties = [sum(1 for _, batch in log if not batch) for log in logs]
    assert max(empties) > 0, "one ran out before the other and pushed empty steps"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resumed_job_continues_the_task_queue_exactly(cluster, tmp_path, mode):
    from tests.conftest import run_in_threads
    data = write_data(tmp_path / "d.svm", 600)
    ckpt, save_at = tmp_path / "ckpt", 20
    first = [[], []]
    c = cluster(servers=1, trainers=2, mode=mode, timeout=10.0)
    # Only the chief saves in async mode (a checkpoint is one cut of every trainer's steps).
    run_in_threads([lambda t=t: train_in_thread(c, t, data, first[t], 400, save_at if t == 0 or mode == "sync"
                                                else None, ckpt) for t in range(2)], timeout=50)
    assert sorted(i for log in first for _, b in log for i in b) == list(range(600))
    c.close()
    from paramshard.checkpoint.format import Checkpoint
    saved = Checkpoint(ckpt)
    cut = {int(t): k for t, k in saved.manifest.get("cut", {}).items()} if mode == "async" else {0: save_at - 1,
                                                                                                   1: save_at - 1}
    before = [i for t, log in enumerate(first) for step, b in log if step <= cut.get(t, -1) for i in b]
    again = [[], []]
    c2 = cluster(servers=1, trainers=2, mode=mode, timeout=10.0)
    run_in_threads([lambda t=t: train_in_thread(c2, t, data, again[t], 400, resume=ckpt) for t in range(2)],
                   timeout=50)
    after = [i for log in again for _, b in log for i in b]
    assert sorted(before + after) == list(range(600)), (len(before), len(after), len(set(before) & set(after)))
    assert before and after
