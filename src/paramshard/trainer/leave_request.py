"""A trainer of an elastic job asked to leave (``paramshard scale JOB --trainers N`` going down).

The launcher sends the trainer process SIGUSR1 (the simplest channel that reaches a local
process at once and needs no new server op). The handler only sets
``Trainer.leave_requested``; nothing leaves inside a signal handler. The batch loops end at
the next step boundary: ``trainer.prefetching(loader)`` stops after the batch whose
``step()`` just ran, and ``trainer.epochs(n)`` yields no further epoch. The script then runs
what follows its loop and ``trainer.close()`` flushes and leaves, as at a normal end; the
launcher counts a trainer that exits 0 after a request as left, not failed. A script with its
own loop checks ``trainer.leave_requested`` after each ``step()``.
"""
from __future__ import annotations

import signal
import threading
import weakref

from paramshard.launch.supervision.signals import LEAVE_SIGNAL


def install(trainer) -> bool:
    """Turn LEAVE_SIGNAL into ``trainer.leave_requested = True``; False (nothing installed) off
    the main thread, where Python cannot take signals."""
    if threading.current_thread() is not threading.main_thread():
        return False
    ref = weakref.ref(trainer)

    def requested(signum, frame):
        t = ref()
        if t is not None:
            t.leave_requested = True
    signal.signal(LEAVE_SIGNAL, requested)
    return True
