"""Server side of ``paramshard.barrier()``: no trainer goes on before every one got there
(client side: paramshard.client.control.barrier).

A barrier is a name, and a trainer enters it for the count-th time (the client
counts, per name). Entry (name, k) is answered once every trainer that has not
left entered (name, k). Trainers that left do not count; a lost one stays
required, so the wait fails at once naming it (``waits_on``: the path a sync
push takes). Only server 0 keeps barriers, so one place decides.

A waiting reply ends at the server's deadline (PARAMSHARD_TIMEOUT) with a
``timeout`` error, yet a barrier may rightly wait longer (for the slowest
trainer's epoch): the client then enters the same count again. So the count a
trainer entered last may come again (a retry: it waits again, or is answered at
once if the barrier completed meanwhile); the next count is taken only once the
last one completed; anything else is an error.

A trainer that started from a checkpoint (``--resume``, a whole-job restart, a rollback)
goes on from the counts saved with it (trainer/loop.py), which a new or restarted server 0
cannot know: its entries say ``resumed`` until one of them passes, and such an entry that
is the trainer's first on this server sets where its count stands. The rules above hold
from the next entry on. A rollback (``reset``) forgets every barrier: counts go back to
the checkpoint's.

A trainer that joins an elastic job mid-way (``join``, server/core/control_handlers.py) is told
where each name's count stands (``on_join``): the count completed, as if it had entered
every count up to there, and it is not waited for in a count some trainer entered before it
joined (that one completes without it, as the step in progress does), though it may enter it
and then waits for it as the others do. From the next count on it is required like anyone.
So a joiner's ``barrier()`` and ``broadcast()`` go on at the job's counts, not from zero.

A broadcast (``Trainer.broadcast``) is a barrier whose every entry says ``broadcast`` and whose
chief's entry carries a small JSON value (json_value.py, checked here before it is kept): every
trainer's reply for that count carries it, a retry of a completed count too. Only the values of
the latest completed count and of the one the chief entered since are kept per name, and all of
them together within MAX_STORED_BYTES; a reset drops them with the barriers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard import json_value
from paramshard.errors import ConfigError, LimitExceeded
from paramshard.messages.server_stats import BarrierStats, BarrierWait
from paramshard.server.core.barrier import Membership
from paramshard.server.core.replies import Deferred, Reply

MAX_NAME_CHARS = 256
MAX_BARRIERS = 4096      # names are kept for the whole job: a script making new ones without end is a bug
MAX_STORED_BYTES = 16 << 20     # broadcast values kept at once, over every name (each is at most 64 KiB)


class _Barrier:
    __slots__ = ("entered", "completed", "broadcast", "values", "joined_after")

    def __init__(self, broadcast: bool = False):
        self.entered: dict[int, int] = {}    # trainer -> the last count it entered
        # A joiner -> the highest count entered by anyone when it joined: it is not waited for
        # up to there (it counts as having entered it; its own entries still wait and go on).
        self.joined_after: dict[int, int] = {}
        self.completed = 0                   # every count up to this one let every trainer through
        self.broadcast = broadcast           # its entries carry the chief's value (a name is one or the other)
        # count -> (the chief's value, its JSON size): the completed count's (a retry may ask
        # for it again) and the next one's, once the chief entered it.
        self.values: dict[int, tuple[object, int]] = {}


class TrainerBarriers:
    """The ``barrier`` op as a Service (server/core/api.py)."""

    def __init__(self, server_id: int, membership: Membership):
        self.server_id = server_id
        self.membership = membership
        self.barriers: dict[str, _Barrier] = {}
        self.stored_bytes = 0               # the broadcast values kept, over every name

    def ops(self) -> dict:
        return {"barrier": self.handle_barrier}

    def hooks(self) -> list:
        return []

    def stats(self) -> BarrierStats:
        waiting = {}
        for name, b in self.barriers.items():
            if self._settle(b) < max(b.entered.values(), default=0):
                waiting[name] = BarrierWait(b.completed + 1, tuple(self._missing(b, b.completed + 1)))
        return BarrierStats(len(self.barriers), waiting)

    def on_leave(self, trainer: int) -> None:
        # It no longer counts (Membership.required); waits it held up complete at the next check.
        for b in self.barriers.values():
            b.entered.pop(trainer, None)
            b.joined_after.pop(trainer, None)

    def on_join(self, trainer: int) -> dict:
        """``trainer`` joined the job now (after ``on_leave`` dropped what its slot's last
        process left): per name, the count it goes on from (the completed one), for the join's
        reply. Barriers named later start at zero for everyone, the joiner too."""
        counts = {}
        for name, b in self.barriers.items():
            completed = self._settle(b)
            b.entered[trainer] = completed
            b.joined_after[trainer] = max(b.entered.values(), default=completed)
            counts[name] = completed
        return {"barrier_counts": counts}

    def reset(self) -> None:
        # The trainers' counts go back to the checkpoint's; waits were voided by fail_waiting.
        self.barriers = {}
        self.stored_bytes = 0

    def handle_barrier(self, header: dict, arrays: list) -> Reply | Deferred:
        trainer, name, count = header["trainer"], header["name"], header["count"]
        broadcast = header.get("broadcast") is True
        what = f"{'broadcast' if broadcast else 'barrier'} {name[:MAX_NAME_CHARS]!r} #{count}"
        if self.server_id != 0:
            raise ConfigError(f"trainer {trainer} sent {what} to server {self.server_id}: barriers are kept "
                              f"by server 0 only (paramshard.client.control.barrier sends them there)")
        if not name or len(name) > MAX_NAME_CHARS:
            raise ConfigError(f"trainer {trainer}: a barrier name must have 1 to {MAX_NAME_CHARS} characters, "
                              f"got {len(name)}")
        if count < 1:
            raise ConfigError(f"trainer {trainer} entered {what}: counts start at 1")
        if arrays:
            raise ConfigError(f"trainer {trainer}: {what} carries no arrays, got {len(arrays)}")
        value, size = self._check_value(header, trainer, broadcast, what)
        self.membership.check_not_left(trainer, f"enter {what}")
        b = self.barriers.get(name)
        if b is None:
            if len(self.barriers) >= MAX_BARRIERS:
                raise LimitExceeded(f"trainer {trainer} entered {what}: {MAX_BARRIERS} barrier names are in "
                                    f"use already; reuse names (each call counts) instead of making new ones")
            b = _Barrier(broadcast)     # kept only once the entry is accepted: a rejected one leaves no trace
        if b.broadcast != broadcast:
            kind, other = ("a broadcast", "trainer.barrier") if b.broadcast else ("a barrier", "trainer.broadcast")
            raise ConfigError(f"trainer {trainer} entered {what}, but {name!r} is {kind} name: give "
                              f"{other} another name")
        self._check_count(b, trainer, name, count, header.get("resumed") is True)
        if size is not None and count not in b.values:    # a retry keeps the first entry's value
            if self.stored_bytes + size > MAX_STORED_BYTES:
                raise LimitExceeded(f"trainer {trainer} entered {what}: the broadcast values server 0 keeps "
                                    f"would pass {MAX_STORED_BYTES} bytes; broadcast smaller values")
            b.values[count] = (value, size)
            self.stored_bytes += size
        self.barriers[name] = b
        b.entered[trainer] = count
        if self._settle(b) >= count:
            return self._passed(b, name, count)
        return Deferred(ready=lambda: self._settle(b) >= count,
                        make_reply=lambda: self._passed(b, name, count),
                        describe=lambda: self._describe(b, name, count),
                        waits_on=lambda: self._missing(b, count))

    def _check_count(self, b: _Barrier, trainer: int, name: str, count: int, resumed: bool) -> None:
        if resumed and trainer not in b.entered:
            # The first entry since the rollback: the count the trainer's checkpoint gave it. The
            # barrier completes up to the smallest count every required trainer entered.
            if b.completed == 0 and not b.entered:
                b.completed = count - 1
            return
        last = b.entered.get(trainer, 0)
        completed = self._settle(b)
        if count == last:
            return          # a retry (the server gave up waiting, the client asks again)
        if count < last:
            raise ConfigError(f"trainer {trainer} entered barrier {name!r} #{count}, older than #{last} it "
                              f"entered already (completed up to #{completed})")
        if count > last + 1:
            raise ConfigError(f"trainer {trainer} entered barrier {name!r} #{count}, but the last it entered is "
                              f"#{last}: counts go 1, 2, 3... per trainer and name (skipped one?)")
        if last > completed:
            raise ConfigError(f"trainer {trainer} entered barrier {name!r} #{count} while #{last} still waits "
                              f"for trainers {self._missing(b, last)}: its wait for #{last} failed, so enter "
                              f"#{last} again (a retry) rather than going on")

    def _check_value(self, header: dict, trainer: int, broadcast: bool, what: str) -> tuple[object, int | None]:
        """The chief's broadcast value and its JSON size (None: this entry carries none), checked
        before anything is kept."""
        if "value" in header and not broadcast:
            raise ConfigError(f"trainer {trainer}: {what} carries a value, but only a broadcast's entries do")
        if not broadcast:
            return None, None
        if trainer != 0:
            if "value" in header:
                raise ConfigError(f"trainer {trainer}: {what} carries a value: only trainer 0's entry does")
            return None, None
        if "value" not in header:
            raise ConfigError(f"trainer 0 entered {what} without the value it broadcasts")
        value = header["value"]
        return value, len(json_value.encoded(value, f"trainer 0's {what} value"))

    def _settle(self, b: _Barrier) -> int:
        """Count ``completed`` up to what every trainer still required entered; returns it.
        Values of counts before the completed one are no longer asked for: they go."""
        required = self.membership.required
        if required:
            b.completed = max(b.completed, min(max(b.entered.get(t, 0), b.joined_after.get(t, 0))
                                               for t in required))
        for count in [c for c in b.values if c < b.completed]:
            self.stored_bytes -= b.values.pop(count)[1]
        return b.completed

    def _missing(self, b: _Barrier, count: int) -> list[int]:
        return sorted(t for t in self.membership.required
                      if max(b.entered.get(t, 0), b.joined_after.get(t, 0)) < count)

    def _describe(self, b: _Barrier, name: str, count: int) -> str:
        missing = self._missing(b, count)
        return f"barrier {name!r} #{count} waits for trainers {missing} to enter it{self.membership.where(missing)}"

    @staticmethod
    def _passed(b: _Barrier, name: str, count: int) -> Reply:
        if not b.broadcast:
            return Reply({"name": name, "count": count})
        if count not in b.values:
            # Every required trainer entered, so trainer 0 left the job before entering it.
            raise ConfigError(f"broadcast {name!r} #{count} has no value: trainer 0 left the job without "
                              f"entering it (every trainer must call broadcast as often as trainer 0)")
        return Reply({"name": name, "count": count, "value": b.values[count][0]})


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py)
    from paramshard.server.core.api import Service
    _service: type[Service] = TrainerBarriers
