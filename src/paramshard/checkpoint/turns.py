"""Checkpoints and server moves take turns on server 0 (server/elastic/move_exclusion.py): the
checkpoint's side, as a context manager.

``checkpoint_turn``: a checkpoint (save or restore) waits while a move is handing partitions
off, and no hand-off starts while it runs. A turn that was not granted within the server's
timeout is asked for again until ``patience`` seconds passed (a move's hand-offs may outlast
one timeout); the error then says who held it. The move's side (``exclude_begin`` who=move
before its first hand-off, ``exclude_end`` after its final routing or its abort) is steps of
its state machine (placement/move_plan.py), asked again the same way.
"""
from __future__ import annotations

import contextlib
import time

from paramshard.errors import RemoteError

PATIENCE = 600.0


def _ask(links, header: dict, patience: float) -> None:
    deadline = time.monotonic() + patience
    while True:
        try:
            links.request(0, header)
            return
        except RemoteError as exc:
            if exc.code != "timeout" or time.monotonic() > deadline:
                raise


@contextlib.contextmanager
def checkpoint_turn(links, trainer: int, patience: float = PATIENCE):
    _ask(links, {"op": "exclude_begin", "who": "checkpoint", "trainer": trainer}, patience)
    try:
        yield
    finally:
        links.request(0, {"op": "exclude_end", "who": "checkpoint", "trainer": trainer})
