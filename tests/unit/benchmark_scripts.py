"""Importing a script of benchmarks/ in a unit test, without leaving benchmarks/ on sys.path.

A script puts its own folder first on sys.path (for _common) when imported; the rest of the
suite must not import from there, but a test whose code spawns a child needs the folder while
it runs (the child imports the script by name). Each caller takes and gives back only its own
entries: removing every copy took away another module's (its spawned child died on import).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys

BENCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def import_script(name: str):
    """benchmarks/<name>.py as a module; sys.path as it was before."""
    held = sys.path.count(BENCH)
    sys.path.insert(0, BENCH)
    try:
        return importlib.import_module(name)
    finally:
        while sys.path.count(BENCH) > held:
            sys.path.remove(BENCH)


@contextlib.contextmanager
def on_the_path():
    """benchmarks/ on sys.path meanwhile (for spawned children), then exactly that entry gone."""
    sys.path.insert(0, BENCH)
    try:
        yield
    finally:
        sys.path.remove(BENCH)
