"""Carry on after a server died and was restarted in place (``launch --max-restarts``).

Every server has a generation (its *epoch*); every data request carries the
trainer's, and a server answers a request of another epoch with ``reset``. A
server restarted by the launcher starts in epoch -1 (recovering): it refuses
every data request until the chief has rebuilt the job's state. Recovery:

1. every trainer waits until every server answers again (deadline: the job's
   timeout);
2. the chief moves every server to a new epoch (``reset``: state dropped,
   waiting requests failed with ``reset``) and restores the latest checkpoint
   onto all of them, so in sync mode every server is back at the same step;
3. the other trainers wait until every server is in one new epoch, then pull
   (their dense pull waits for the chief's dense restore, which comes last).

Stale requests (sent before a trainer noticed) carry the old epoch and are
refused, so nothing from before the rollback is applied after it.
"""
from __future__ import annotations

import dataclasses
import time

from paramshard.checkpoint.format import Checkpoint
from paramshard.errors import DeadlineExceeded, RemoteError, ServerUnavailable
from paramshard.log import get_logger
from paramshard.transport.links import ServerLinks

log = get_logger("recovery")

# Errors a trainer can recover from when recovery is on: a server gone, or a server
# that dropped this trainer's request in a reset (or while recovering).
RECOVERABLE_CODES = ("reset", "peer_lost")


def recoverable(exc: BaseException) -> bool:
    if isinstance(exc, ServerUnavailable):
        return True
    return isinstance(exc, RemoteError) and exc.code in RECOVERABLE_CODES


@dataclasses.dataclass
class RecoveryPolicy:
    """Whether a failed request is rolled back from or raised: recovery is on with
    ``--max-restarts`` and a checkpoint directory, in a mode whose state a checkpoint
    holds, for errors a restarted server explains, at most ``max_restarts`` times."""
    max_restarts: int = 0
    checkpoint_dir: str | None = None
    used: int = 0                   # rollbacks so far

    @classmethod
    def for_env(cls, env) -> "RecoveryPolicy":
        if env.recovery == "bounded-loss":     # no rollback: the links wait and resend (ServeAgain)
            return cls(0, None)
        return cls(env.max_restarts if env.mode.checkpoints else 0, env.checkpoint_dir)

    def admits(self, exc: BaseException) -> bool:
        return bool(self.max_restarts and self.checkpoint_dir and recoverable(exc)) and self.used < self.max_restarts

    def take(self, exc: BaseException) -> int:
        """Count one rollback for ``exc`` (its number), or re-raise ``exc`` when it is not admitted."""
        if not self.admits(exc):
            raise exc
        self.used += 1
        return self.used


def _generations(links: ServerLinks, deadline: float) -> list[int]:
    """Every server's epoch, once every server answers (restarted ones take a moment)."""
    while True:
        try:
            return [h["generation"] for h in links.wait_ready(timeout=max(1.0, min(5.0, deadline - time.monotonic())))]
        except (ServerUnavailable, DeadlineExceeded) as exc:
            if time.monotonic() > deadline:
                raise DeadlineExceeded(f"recovery: the servers did not all come back in time ({exc})") from None
            time.sleep(0.2)


def next_epoch(generations: list[int], seen: int) -> int:
    """The epoch a rollback moves to: past every server's and past the newest this trainer saw.

    A restarted server reports -1 (it remembers nothing), so when every server restarted the
    servers alone would name epoch 0 again: the epoch the other trainers already hold, which
    they would take for no rollback at all (and whose stale requests a server would accept)."""
    return max(max(generations), seen) + 1


def reset_servers(links: ServerLinks, timeout: float, trainer_id: int) -> int:
    """Chief: move every server to one new epoch, its state dropped. Returns the epoch."""
    deadline = time.monotonic() + timeout
    epoch = next_epoch(_generations(links, deadline), links.epoch)
    links.request_many({s: ({"op": "reset", "epoch": epoch, "trainer": trainer_id}, ()) for s in range(len(links))})
    return epoch


def wait_for_new_epoch(links: ServerLinks, old: int, timeout: float) -> int:
    """Others: wait until every server is in one epoch newer than ``old``."""
    deadline = time.monotonic() + timeout
    while True:
        seen = _generations(links, deadline)
        if len(set(seen)) == 1 and seen[0] > old:
            return seen[0]
        if time.monotonic() > deadline:
            raise DeadlineExceeded(f"recovery: the chief did not restore the servers within {timeout:g} s "
                                   f"(epochs {seen}); is trainer 0 alive?")
        time.sleep(0.1)


def roll_back(links: ServerLinks, plan, optimizer, tables, checkpoint_dir, is_chief: bool, trainer_id: int,
              timeout: float, routing=None) -> Checkpoint | None:
    """Bring every server back to the latest checkpoint (the chief does it, the others
    wait for it); returns the checkpoint when this trainer can read it. ``routing``: where the
    sparse rows go (an elastic job's current one; None: the fixed hash over ``links``)."""
    from paramshard.client.checkpoint import open_for_resume, restore_checkpoint
    old = links.epoch
    if is_chief:
        ckpt = Checkpoint(checkpoint_dir)       # before the reset: no checkpoint, nothing to roll back to
        links.epoch = reset_servers(links, timeout, trainer_id)
        restore_checkpoint(links, plan, optimizer, tables, ckpt, trainer_id, routing=routing)
        log.warning("trainer %d: restored checkpoint %s (step %d) onto every server, epoch %d", trainer_id,
                    ckpt.path, ckpt.step, links.epoch)
        return ckpt
    links.epoch = wait_for_new_epoch(links, old, timeout)
    return open_for_resume(checkpoint_dir, required=False)


class ServeAgain:
    """Bounded-loss recovery (PARAMSHARD_RECOVERY=bounded-loss, async and geo): the retry policy of a
    trainer's ServerLinks. A request whose server died, or that a restarted server refused while
    not serving yet (``reset``), waits until the server answers in this trainer's epoch again (the
    launcher restarted it and its replica keeper restored it: launch/elastic/replica_keeper.py), then goes
    again (transport/links.py). No rollback: the job loses only what the dead server applied after
    its last copy. Deadline: the job's timeout from the failure; the error names the server."""
    codes = ("reset",)

    def __init__(self, timeout: float, poll: float = 0.05):
        self.timeout, self.poll = timeout, poll
        self.waits: list[float] = []         # seconds each wait took (tests, benchmarks)

    def wait_serving(self, links: ServerLinks, server: int, cause: Exception) -> None:
        started = time.monotonic()
        deadline = started + self.timeout
        seen = None
        while True:
            try:       # a probe fails plainly (retry=False); the retry policy stays on for the other tickets
                probe = links.submit([(server, {"op": "hello"}, ())],
                                     timeout=max(0.2, min(2.0, deadline - time.monotonic())), retry=False)
                seen = links.collect(probe)[0][0]["generation"]
            except (ServerUnavailable, DeadlineExceeded):
                pass
            if seen == links.epoch:
                break
            if seen is not None and seen > links.epoch:
                raise cause       # the job moved on (a rollback): nothing to retry into
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"{links.who}: server {server} ({links.links[server].address}) did not serve again within "
                    f"{self.timeout:g} s of failing ({cause}); last seen in epoch {seen} (-1: restarted, not "
                    f"restored from the replica: is the launcher's replica keeper running?)") from None
            time.sleep(self.poll)
        self.waits.append(time.monotonic() - started)
        log.warning("%s: server %d serves again after %.2f s; resending what it did not answer", links.who,
                    server, self.waits[-1])


def install(links, env) -> None:
    """Give a trainer's ``links`` the retry policy of ``env``'s recovery (bounded-loss:
    ServeAgain); the links of anyone else (a watcher, a tool) get none."""
    if env.role != "trainer":
        return
    if getattr(env, "recovery", "rollback") == "bounded-loss" and not env.mode.waits_every_step:
        links.retry = ServeAgain(env.timeout)
