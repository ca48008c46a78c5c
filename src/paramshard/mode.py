"""The job's training mode: the one place that knows what each mode means.

``PARAMSHARD_MODE`` is parsed once (``Mode.parse``) and everything else asks the
mode a question (``mode.dense_on_servers``, ``mode.allreduce``, ...) instead of
comparing strings, so a new mode is one member here plus its trainer backend.

- sync: dense blocks and sparse tables on the servers; every step waits for a
  barrier on the servers (the result equals one process on the global batch).
- async: the same, each trainer's push applied as it comes (optionally bounded
  staleness, pushes left in flight).
- collective: no servers; dense gradients averaged by allreduce among the trainers.
- hybrid: dense by allreduce, sparse tables on servers that keep sync steps.

A ``StrEnum``: a member is its string (JSON, msgpack, f-strings, the environment).
"""
from __future__ import annotations

import enum

from paramshard.errors import ConfigError


class Mode(enum.StrEnum):
    SYNC = "sync"
    ASYNC = "async"
    COLLECTIVE = "collective"
    HYBRID = "hybrid"

    @classmethod
    def parse(cls, text: "str | Mode", setting: str = "PARAMSHARD_MODE") -> "Mode":
        """The mode named by ``text`` (case-insensitive); ConfigError naming ``setting`` otherwise."""
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise ConfigError(f"{setting}={text!r}: expected one of {', '.join(m.value for m in cls)}") from None

    @property
    def has_servers(self) -> bool:
        """Parameter servers take part (every mode but collective)."""
        return self is not Mode.COLLECTIVE

    @property
    def dense_on_servers(self) -> bool:
        """Dense blocks live on the servers (sync, async)."""
        return self in (Mode.SYNC, Mode.ASYNC)

    @property
    def allreduce(self) -> bool:
        """Dense gradients are averaged by allreduce among the trainers (collective, hybrid)."""
        return self in (Mode.COLLECTIVE, Mode.HYBRID)

    @property
    def server_mode(self) -> "Mode":
        """How the servers apply pushes: hybrid keeps sync steps for its sparse tables."""
        return Mode.ASYNC if self is Mode.ASYNC else Mode.SYNC

    @property
    def waits_every_step(self) -> bool:
        """Every step waits for all trainers (no pushes left in flight, no staleness)."""
        return self is not Mode.ASYNC

    @property
    def checkpoints(self) -> bool:
        """Trainer.save() and rollbacks are available (the dense state is on the servers)."""
        return self.dense_on_servers


PS_MODES = (Mode.SYNC, Mode.ASYNC)      # the servers' own two ways of applying pushes
MODES = tuple(Mode)
