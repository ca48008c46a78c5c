"""Logging with the process's role and rank in every line (no print in library code)."""
from __future__ import annotations

import logging
import os
import sys

from paramshard.settings.process_variables import LOG_LEVEL

_configured = False
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LEVEL_VARIABLE = LOG_LEVEL.env


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("paramshard") else f"paramshard.{name}")


def configure(rank_name: str, level: str | None = None) -> None:
    """Set up the 'paramshard' logger once per process, tagged e.g. 'trainer 1'.

    The level is ``level`` if given, else PARAMSHARD_LOG_LEVEL (DEBUG, INFO, WARNING
    or ERROR; default INFO). A bad variable value logs a warning naming it and uses INFO."""
    global _configured
    root = logging.getLogger("paramshard")
    problem = None
    if level is not None:
        if level.strip().upper() not in LEVELS:
            raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
        level = level.strip().upper()
    else:
        level, problem = level_from_environ(os.environ)
    root.setLevel(level)
    if _configured:
        for h in root.handlers:
            h.setFormatter(_formatter(rank_name))
    else:
        handler = CurrentStderr()
        handler.setFormatter(_formatter(rank_name))
        root.addHandler(handler)
        root.propagate = False
        _configured = True
    if problem:
        root.warning("%s", problem)


class CurrentStderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a line is logged, not as it was when logging was set
    up: whoever replaced it since (a notebook, pytest's capture of one test) gets the line, and a
    stream closed since is never written to (a server thread logging after the test that set up
    logging ended died in ``I/O operation on closed file``)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property               # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass                # always the current sys.stderr


def level_from_environ(environ) -> tuple[str, str | None]:
    """(level, problem): PARAMSHARD_LOG_LEVEL read case-insensitively; INFO when unset
    or empty, and INFO with a message naming the variable when the value is not a level."""
    raw = LOG_LEVEL.read(environ)
    value = raw.strip().upper()
    if not value:
        return "INFO", None
    if value not in LEVELS:
        return "INFO", (f"{LEVEL_VARIABLE}={raw!r} is not a log level (expected one of "
                        f"{', '.join(LEVELS)}): using INFO")
    return value, None


def _formatter(rank_name: str) -> logging.Formatter:
    return logging.Formatter(f"%(asctime)s [{rank_name}] %(levelname)s %(message)s", "%H:%M:%S")
