"""What a handler returns: an answer now, or an answer once a condition holds."""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np


@dataclasses.dataclass
class Reply:
    fields: dict = dataclasses.field(default_factory=dict)
    arrays: Sequence[np.ndarray] = ()


@dataclasses.dataclass
class Deferred:
    """Answered by ``make_reply()`` as soon as ``ready()`` is true; if the
    deadline passes first the client gets an error built from ``describe()``.
    ``waits_on()`` names the trainers it needs: if one of them loses its
    connection, the wait fails at once instead of at the deadline."""
    ready: Callable[[], bool]
    make_reply: Callable[[], Reply]
    describe: Callable[[], str]
    waits_on: Callable[[], list[int]] | None = None
