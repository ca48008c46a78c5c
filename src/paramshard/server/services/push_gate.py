"""A consistent cut across servers for an async checkpoint (a two-phase snapshot).

In async mode every server applies pushes as they arrive, so "the state now"
differs from server to server: trainer 2's step 41 may have reached server 0
and not yet server 1. A checkpoint must hold, for every trainer, the same steps
on every server. The chief asks every server to:

1. ``pause``: hold every push from now on, and say, per stream (dense blocks,
   each sparse table) and trainer, the last step applied;
2. ``cut``: the chief sends, per trainer, the highest step any server applied;
   each server applies the held pushes up to that step, waits for the ones still
   on their way (an async trainer has at most one step in flight: it waits for
   every reply before its next step), and keeps holding later ones;
3. after the snapshot, ``resume``: the held pushes are applied, in arrival order.

A server left paused for longer than its timeout (a chief that died mid-save)
resumes by itself.

``PushGateHook`` puts the gate on the request path (server/core/hooks.py): it holds
the pushes the gate says to hold and notes the steps applied. The checkpoint
service (checkpoint_service.py) declares it.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING


from paramshard.log import get_logger
from paramshard.server.core.context import ServerContext
from paramshard.server.core.hooks import Incoming, Verdict

log = get_logger("server")
PUSH_OPS = ("push_dense", "push_sparse")


class PushGate:
    def __init__(self, timeout: float, clock=time.monotonic):
        self.timeout = timeout
        self._clock = clock
        self.applied: dict[str, dict[int, int]] = {}     # stream -> trainer -> last step applied
        self.paused_at: float | None = None
        self.cut: dict[int, int] | None = None
        self.held: list = []                              # frames, in arrival order
        # Elastic jobs: per stream and trainer the newest routing version its applied pushes carried.
        # A server that joined mid-job gets a trainer's pushes only from the routing that first named
        # it on; the chief waits there only for the streams and trainers already routing to it
        # (``skip``: the pairs not to wait for; client/checkpoint.py).
        self.routings: dict[str, dict[int, int]] = {}
        self.skip: set[tuple[str, int]] = set()

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def note_applied(self, stream: str, trainer: int, step: int, routing: int | None = None) -> None:
        versions = self.routings.setdefault(stream, {})
        if routing is not None and routing > versions.get(trainer, -1):
            versions[trainer] = routing
        seen = self.applied.setdefault(stream, {})
        if step > seen.get(trainer, -1):
            seen[trainer] = step

    def pause(self) -> list:
        """Start holding; the applied steps as [[stream, trainer, step], ...]."""
        self.paused_at = self._clock()
        self.cut = None
        return [[s, t, k] for s, by in sorted(self.applied.items()) for t, k in sorted(by.items())]

    def should_hold(self, trainer: int, step: int) -> bool:
        if not self.paused:
            return False
        return self.cut is None or step > self.cut.get(trainer, -1)

    def set_cut(self, cut: dict[int, int], skip=()) -> list:
        """Take the cut; returns the held pushes that now go through (those up to the cut).
        ``skip``: (stream, trainer) pairs whose pushes do not come here (not waited for)."""
        self.cut = dict(cut)
        self.skip = set(skip)
        release = [h for h in self.held if not self.should_hold(h[0], h[1])]
        self.held = [h for h in self.held if self.should_hold(h[0], h[1])]
        return release

    def missing(self, streams: list[str]) -> list[tuple[str, int, int]]:
        """(stream, trainer, step) still to arrive before this server's state is at the cut."""
        if self.cut is None:
            return []
        out = []
        for stream in streams:
            seen = self.applied.get(stream, {})
            out += [(stream, t, k) for t, k in sorted(self.cut.items())
                    if seen.get(t, -1) < k and (stream, t) not in self.skip]
        return out

    def resume(self) -> list:
        """Stop holding; returns every held push, in arrival order."""
        released, self.held = self.held, []
        self.paused_at, self.cut, self.skip = None, None, set()
        return released

    def expired(self) -> bool:
        return self.paused and self._clock() - self.paused_at > self.timeout


class PushGateHook:
    """A RequestHook: in async mode, a push the gate holds waits in ``gate.held``."""

    def __init__(self, gate: PushGate, context: ServerContext):
        self.gate, self.context = gate, context

    def admit(self, request: Incoming) -> Verdict:
        if (request.op in PUSH_OPS and request.held is not None and not self.context.mode.waits_every_step
                and self.gate.should_hold(request.pusher(), request.header["step"])):
            self.gate.held.append((request.pusher(), request.header["step"], request.held))
            return Verdict.HOLD
        return Verdict.ACCEPT

    def applied(self, request: Incoming) -> None:
        if request.op in PUSH_OPS:
            header = request.header
            self.gate.note_applied("dense" if request.op == "push_dense" else f"sparse:{header['table']}",
                                   request.pusher(), header["step"], header.get("routing"))

    def tick(self) -> None:
        if self.gate.expired():
            log.warning("%s: paused for a checkpoint for more than %g s without a resume (the chief died "
                        "mid-save?): applying the %d held pushes", self.context.name, self.gate.timeout,
                        len(self.gate.held))
            self.release(self.gate.resume())

    def release(self, held: list) -> None:
        """Hand pushes the gate held back to the core, in their arrival order."""
        self.context.resubmit([frames for _, _, frames in held])


if TYPE_CHECKING:   # `make typecheck` checks the contract: RequestHook (server/core/hooks.py)
    from paramshard.server.core.hooks import RequestHook
    _request_hook: type[RequestHook] = PushGateHook
