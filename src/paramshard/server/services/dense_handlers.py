"""Server side of the dense requests (client side: paramshard.client.dense)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard.errors import ConfigError, Moved
from paramshard.optim import from_wire
from paramshard.messages.server_stats import DenseStats
from paramshard.server.storage.dense_store import DenseStore, check_distinct
from paramshard.server.core.replies import Deferred, Reply


class DenseHandlers:
    """The dense-block Service (server/core/api.py)."""

    def __init__(self, store: DenseStore):
        self.store = store

    def ops(self) -> dict:
        return {op: getattr(self, f"handle_{op}") for op in ("register_dense", "pull_dense", "push_dense")}

    def hooks(self) -> list:
        return []

    def stats(self) -> DenseStats:
        # Staleness is counted in async mode only: a sync server's reply has no histogram at all.
        return DenseStats(len(self.store.blocks), self.store.elements,
                          self.store.clocks.stats() if not self.store.mode.waits_every_step else None)

    def on_leave(self, trainer: int) -> None:
        self.store.on_leave(trainer)

    def steps_done(self) -> int:
        """Steps complete here (sync: the blocks' highest version; async: the fastest trainer's
        applied steps): where a joiner of an elastic job starts (control_handlers.handle_join)."""
        if not self.store.mode.waits_every_step:
            return self.store.clocks.fastest()
        return max((b.version for b in self.store.blocks.values()), default=0)

    def reset(self) -> None:
        self.store.forget()
        self.store.clocks.reset()

    def handle_register_dense(self, header: dict, arrays: list) -> Reply:
        names = header["names"]
        self.store.register(header["trainer"], names, arrays, from_wire(header["optimizer"]),
                            header["plan_fingerprint"])
        return Reply({"blocks": len(names)})

    def handle_pull_dense(self, header: dict, arrays: list) -> Reply | Deferred:
        names, version = header["names"], header["min_version"]
        self._check_plan(header["plan_fingerprint"])
        check_distinct(names, "pull_dense")
        if self.store.registered:
            self.store.lookup(names)   # raises at once for names this server never had
        resume = header.get("resume_step")
        if resume is not None and not self.store.mode.waits_every_step:
            return self._gated_pull(names, resume)
        return Deferred(
            ready=lambda: self.store.has_all(names) and self.store.versions_reached(names, version),
            make_reply=lambda: self._values_reply(names),
            describe=lambda: self._describe_wait(names, version),
            waits_on=lambda: self.store.waiting_for(names) if self.store.has_all(names) else [0],
        )

    def _gated_pull(self, names: list[str], resume: int) -> Reply | Deferred:
        """The values once every trainer may start step ``resume`` (the gate of a bounded-staleness
        push reply that said ``follow``: its blocks moved while it waited)."""
        clocks = self.store.clocks
        bound = clocks.bound        # None: no bound, every trainer may start any step
        if bound is None or clocks.may_start(resume, names):
            return self._values_reply(names)
        return Deferred(
            # Frozen again meanwhile (a second move): refused as moved on this ``follow`` too,
            # nothing of a pull being applied, and the trainer asks the next owner.
            ready=lambda: clocks.may_start(resume, names) or self._moving(names),
            make_reply=lambda: (self._refuse_moved(names) if self._moving(names) else self._values_reply(names)),
            describe=lambda: (f"a pull of dense blocks may be answered only when every trainer finished step "
                              f"{resume - bound - 1} (--max-staleness {bound}); waiting for "
                              f"trainers {clocks.laggards(resume, names)}"),
            waits_on=lambda: clocks.laggards(resume, names),
        )

    def _refuse_moved(self, names: list[str]) -> Reply:
        moving = [n for n in names if n in self.store.handed_away]
        raise Moved(f"dense blocks {moving[:3]} moved to another server while this pull waited; fetch the "
                    f"routing (routing_get on server 0) and resend")

    def handle_push_dense(self, header: dict, arrays: list) -> Reply | Deferred:
        names, step = header["names"], header["step"]
        self.store.push(header["trainer"], step, names, arrays)
        if not self.store.mode.waits_every_step:      # async: applied on arrival
            staleness, clocks = self.store.last_staleness, self.store.clocks
            resume = header.get("resume_step")
            if resume is not None and not clocks.may_start(resume, names):
                # Bounded staleness: this trainer is too far ahead; the reply lets it go on. If a
                # move freezes one of these blocks meanwhile, the trainers' next pushes of it go to
                # its new owner and never tick the clocks here: the reply then says ``follow`` (the
                # push is applied, once; no values) and the trainer waits for the same gate with
                # a pull at the blocks' owners, whose clocks carry these (dense_import). So the
                # values it starts step ``resume`` with hold every trainer's steps up to
                # resume - bound - 1, and the push is never resent (docs/DESIGN.md 5f).
                return Deferred(
                    ready=lambda: clocks.may_start(resume, names) or self._moving(names),
                    make_reply=lambda: (self._follow_reply(resume, staleness) if self._moving(names) else
                                        self._async_reply(names, header["reply_values"], staleness)),
                    describe=lambda: (f"trainer {header['trainer']} may start step {resume} only when every "
                                      f"trainer finished step {resume - clocks.bound - 1} (--max-staleness "
                                      f"{clocks.bound}); waiting for trainers {clocks.laggards(resume, names)}"),
                    waits_on=lambda: clocks.laggards(resume, names),
                )
            return self._async_reply(names, header["reply_values"], staleness)
        if not header["reply_values"]:
            return Reply()
        # A move cannot drop these blocks under this wait: their freeze waits for the step before
        # the switch, this step or an earlier one (later ones are refused), and the pass that finds
        # it ready answers this reply too (tests/unit/server/core/test_dense_move_deferred.py).
        return Deferred(
            ready=lambda: self.store.versions_reached(names, step + 1),
            make_reply=lambda: self._values_reply(names),
            describe=lambda: self._describe_wait(names, step + 1),
            waits_on=lambda: self.store.waiting_for(names),
        )

    def _moving(self, names: list[str]) -> bool:
        return any(n in self.store.handed_away for n in names)

    @staticmethod
    def _follow_reply(resume: int, staleness: int | None) -> Reply:
        return Reply({"staleness": staleness, "follow": resume})

    def _async_reply(self, names: list[str], values: bool, staleness: int | None) -> Reply:
        reply = self._values_reply(names) if values else Reply()
        reply.fields["staleness"] = staleness
        return reply

    def _check_plan(self, fingerprint: int) -> None:
        registered = self.store.plan_fingerprint
        if registered is not None and fingerprint != registered:
            raise ConfigError(f"this trainer's shard plan ({fingerprint:#x}) differs from the one the "
                              f"chief registered ({registered:#x}): every trainer must build the same "
                              f"model with the same --dispatch and --min-block-size")

    def _values_reply(self, names: list[str]) -> Reply:
        blocks = self.store.lookup(names)
        # Sync mode may send the live buffers without a copy: no block can change
        # before every trainer has received this step's values and pushed again.
        # Async pushes land at any time, so they get a snapshot.
        copy = not self.store.mode.waits_every_step
        arrays = [b.values.copy() if copy else b.values for b in blocks]
        return Reply({"versions": [b.version for b in blocks]}, arrays)

    def _describe_wait(self, names: list[str], version: int) -> str:
        if not self.store.has_all(names):
            return ("the chief (trainer 0) has not registered the parameters yet; "
                    "is trainer 0 running and building the same model?")
        late = self.store.waiting_for(names)
        return (f"step {version} of {len(names)} blocks is not complete: trainers {late} have not "
                f"pushed their gradients (slow, stuck or dead?)")


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py)
    from paramshard.server.core.api import Service
    _service: type[Service] = DenseHandlers
