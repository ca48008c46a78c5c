"""A stream run ends at SIGTERM or Ctrl-C after the batch in hand: the first signal is noted (the
loop looks between batches), the handlers before it are back for a second one and after the run."""
import os
import signal

from paramshard.apps.ctr.stream.run import StopSignals


def test_the_first_signal_is_noted_and_the_previous_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with StopSignals() as signals:
        assert signals.received is None
        os.kill(os.getpid(), signal.SIGTERM)        # delivered to this (the main) thread before kill returns
        assert signals.received == "SIGTERM"
        assert {s: signal.getsignal(s) for s in before} == before     # a second signal acts as before
    assert {s: signal.getsignal(s) for s in before} == before


def test_ctrl_c_is_noted_too():
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.received == "SIGINT"
