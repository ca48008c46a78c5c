"""trainer/leave_request.py: the launcher's signal becomes ``leave_requested``, and the batch loops
(trainer/prefetch.py, trainer/epochs.py) end at the next step boundary: the batch being trained is
the last one."""
import os
import signal
import threading

from paramshard.launch.supervision.signals import LEAVE_SIGNAL
from paramshard.trainer import leave_request
from paramshard.trainer.epochs import epochs
from paramshard.client.recovery import RecoveryPolicy
from paramshard.trainer.prefetch import prefetching
from paramshard.trainer.progress import TrainerProgress


class FakeTrainer:
    """What the loops read of a Trainer: no tables, no checkpoints, its progress."""
    tables: dict = {}
    leave_requested = False

    def __init__(self):
        self.progress = TrainerProgress(0, RecoveryPolicy(0))
        self.env = type("Env", (), {"checkpoint_dir": None})()

    class backend:
        @staticmethod
        def forget_fetches():
            pass


def test_the_signal_sets_leave_requested():
    before = signal.getsignal(LEAVE_SIGNAL)
    try:
        t = FakeTrainer()
        assert leave_request.install(t)
        os.kill(os.getpid(), LEAVE_SIGNAL)
        assert t.leave_requested is True
    finally:
        signal.signal(LEAVE_SIGNAL, before)


def test_off_the_main_thread_nothing_is_installed():
    out = []
    thread = threading.Thread(target=lambda: out.append(leave_request.install(FakeTrainer())))
    thread.start()
    thread.join(5)
    assert out == [False]


def test_the_loops_end_after_the_batch_being_trained():
    t = FakeTrainer()
    trained = []
    for epoch in epochs(t, 3):
        for batch in prefetching(t, range(100)):
            trained.append((epoch, batch))
            t.progress.advance()
            if batch == 4 and epoch == 2:
                t.leave_requested = True        # asked while batch 4 of epoch 2 trains
    assert trained == [(1, b) for b in range(100)] + [(2, b) for b in range(5)]
