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
- geo: GEO-SGD (local SGD): each trainer trains a local replica of the dense parameters and
  the rows it touches with the model's optimizer, and every k steps sends the change of what it
  touched, divided by the number of trainers; the servers add it as it comes (docs/modes.md).

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
    GEO = "geo"

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
        """Dense blocks live on the servers (sync, async; geo: the merged values, each trainer
        training a replica of them)."""
        return self in (Mode.SYNC, Mode.ASYNC, Mode.GEO)

    @property
    def allreduce(self) -> bool:
        """Dense gradients are averaged by allreduce among the trainers (collective, hybrid)."""
        return self in (Mode.COLLECTIVE, Mode.HYBRID)

    @property
    def server_mode(self) -> "Mode":
        """How the servers apply pushes: hybrid keeps sync steps for its sparse tables; geo's
        rounds are added as they come."""
        return Mode.ASYNC if self in (Mode.ASYNC, Mode.GEO) else Mode.SYNC

    @property
    def waits_every_step(self) -> bool:
        """Every step waits for all trainers (no pushes left in flight, no staleness)."""
        return self not in (Mode.ASYNC, Mode.GEO)

    @property
    def local_rounds(self) -> bool:
        """Trainers train a local replica and send the change every k steps (geo): a push is a
        round's delta, which the servers add, not a gradient their optimizer applies."""
        return self is Mode.GEO

    @property
    def servers_bound_staleness(self) -> bool:
        """``--max-staleness`` gates pushes on the servers (async, SSP). In geo mode it bounds k,
        the trainers' local steps between two sends, instead."""
        return self is Mode.ASYNC

    @property
    def elastic_trainers(self) -> bool:
        """Trainers may join and leave while the job trains (--min-trainers): sync, async and geo
        (a leaving geo trainer sends its round in progress; docs/modes.md, GEO)."""
        return self in (Mode.SYNC, Mode.ASYNC, Mode.GEO)

    @property
    def checkpoints(self) -> bool:
        """Trainer.save() and rollbacks are available (the dense state is on the servers)."""
        return self.dense_on_servers


PS_MODES = (Mode.SYNC, Mode.ASYNC)      # the servers' own two ways of applying pushes
MODES = tuple(Mode)
