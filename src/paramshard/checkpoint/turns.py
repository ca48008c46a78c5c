"""Checkpoints and server moves take turns on server 0 (server/move_exclusion.py): the
client side of both, as context managers.

``checkpoint_turn``: a checkpoint (save or restore) waits while a move is handing partitions
off, and no hand-off starts while it runs. ``move_turn``: a move's hand-off phase (from the
first hand-off to its final routing) waits for a checkpoint in progress; in sync mode also for
server 0 to complete the step before the switch (``after_step``). A turn that was not granted
within the server's timeout is asked for again until ``patience`` seconds passed (a large
table's checkpoint may outlast one timeout); the error then says who held it.
"""
from __future__ import annotations

import contextlib
import time

from ..errors import RemoteError

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


@contextlib.contextmanager
def move_turn(links, after_step: int | None = None, patience: float = PATIENCE):
    header = {"op": "exclude_begin", "who": "move"}
    if after_step is not None:
        header["after_step"] = after_step
    _ask(links, header, patience)
    try:
        yield
    finally:
        links.request(0, {"op": "exclude_end", "who": "move"})
