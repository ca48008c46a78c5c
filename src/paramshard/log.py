"""Logging with the process's role and rank in every line (no print in library code)."""
from __future__ import annotations

import logging
import os
import sys

_configured = False


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("paramshard") else f"paramshard.{name}")


def configure(rank_name: str, level: str | None = None) -> None:
    """Set up the 'paramshard' logger once per process, tagged e.g. 'trainer 1'."""
    global _configured
    root = logging.getLogger("paramshard")
    level = level or os.environ.get("PARAMSHARD_LOG_LEVEL", "INFO")
    root.setLevel(level.upper())
    if _configured:
        for h in root.handlers:
            h.setFormatter(_formatter(rank_name))
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(rank_name))
    root.addHandler(handler)
    root.propagate = False
    _configured = True


def _formatter(rank_name: str) -> logging.Formatter:
    return logging.Formatter(f"%(asctime)s [{rank_name}] %(levelname)s %(message)s", "%H:%M:%S")
