"""Stop signals for a launcher: SIGINT, SIGTERM and SIGHUP all stop the whole job.

SIGTERM (what `timeout`, Slurm, Kubernetes and systemd send) and SIGHUP raise
StopSignal in the main thread, as SIGINT raises KeyboardInterrupt; the
launcher then stops every process and exits with 128 + the signal number.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from paramshard.log import get_logger

# Sent by the launcher to a trainer of an elastic job it asks to leave (launch/elastic/elastic_trainers.py);
# the trainer leaves at its next step boundary (trainer/leave_request.py).
LEAVE_SIGNAL = signal.SIGUSR1

log = get_logger("launch")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignal(BaseException):
    """SIGTERM or SIGHUP arrived: raised in the main thread, as SIGINT raises KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _handling(signals, handler) -> Iterator[None]:
    """Within the block, ``handler`` takes these signals (main thread only); a signal
    the process was told to ignore (e.g. SIGHUP under nohup) stays ignored."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop_signals():
    """Within the block, SIGTERM and SIGHUP raise StopSignal, as SIGINT raises KeyboardInterrupt."""
    def raise_stop(signum, frame):
        raise StopSignal(signum)
    return _handling((signal.SIGTERM, signal.SIGHUP), raise_stop)


def _signals_hurry(hurry: threading.Event):
    """While stopping, a further stop signal kills the children at once instead of interrupting."""
    def on_signal(signum, frame):
        if not hurry.is_set():
            log.warning("%s again: killing every process of the job now", signal.Signals(signum).name)
        hurry.set()
    return _handling(STOP_SIGNALS, on_signal)


def signal_number(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt (SIGINT) or StopSignal."""
    return getattr(exc, "signum", signal.SIGINT)
