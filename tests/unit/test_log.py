"""The paramshard logger writes to sys.stderr as it is when a line is logged (log.py)."""
import io
import logging
import sys

from paramshard import log


def test_a_line_goes_to_the_stderr_of_now_not_to_the_one_logging_was_set_up_with(monkeypatch):
    root = logging.getLogger("paramshard")
    saved = (list(root.handlers), root.propagate, root.level, log._configured)
    monkeypatch.setattr(log, "_configured", False)
    root.handlers[:] = []
    try:
        first = io.StringIO()
        monkeypatch.setattr(sys, "stderr", first)
        log.configure("trainer 3")
        first.close()                       # e.g. the capture of the test that set logging up
        now = io.StringIO()
        monkeypatch.setattr(sys, "stderr", now)
        log.get_logger("server").warning("server %d: still here", 1)
        assert "[trainer 3] WARNING server 1: still here" in now.getvalue()
    finally:
        root.handlers[:], root.propagate, root.level = saved[0], saved[1], saved[2]
        log._configured = saved[3]
