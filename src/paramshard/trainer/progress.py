"""``TrainerProgress``: where one trainer is in the job, and the one owner of it.

A trainer's place is its step, where its batch loop is in the data (trainer/loop.py), the
script's ``state``, how often it passed each named barrier, and which checkpoint step it saved
last. A resume (``resume=``) and a rollback (client/recovery.py admits a failure) put all of
that back at a checkpoint together, so one object holds it and every module that moves it
(the Trainer, epochs(), prefetching(), barriers and broadcasts, checkpoints, a RowSource)
goes through its methods instead of the Trainer's attributes.

The rollback's part on the servers (every server back at the latest checkpoint, the dense
values pulled into this trainer's parameters, gradients dropped) is the Trainer's backend's:
the Trainer hands that in as ``restore`` once its values exist (``restore_with``).
"""
from __future__ import annotations

from typing import Callable

from paramshard.client.recovery import RecoveryPolicy
from paramshard.errors import ParamshardError
from paramshard.log import get_logger
from paramshard.trainer.loop import LoopPosition
from paramshard.trainer.position import restore_random_streams

log = get_logger("trainer")

# restore() -> (the checkpoint if this trainer can read it, else None; the step the servers'
# dense version stands for when there is no checkpoint here, else None)
Restore = Callable[[], tuple]


class TrainerProgress:
    def __init__(self, trainer_id: int, recovery: RecoveryPolicy):
        self.trainer_id = trainer_id
        self.recovery = recovery
        self.step = 0
        self.position: dict = {}     # what the checkpoint resumed from says of this trainer ({} for a new job)
        # Anything JSON the script keeps here (Trainer.state) is saved with every checkpoint of
        # this trainer and is the checkpoint's again after a resume or a rollback.
        self.state: dict = {}
        self.loop = LoopPosition()      # where epochs()/prefetching() are in the data (trainer/loop.py)
        # A live stream this trainer's steps train on (data/stream/reader.py registers itself):
        # each checkpoint saves its position at the checkpoint's step and commits it once written.
        self.stream = None
        # A rollback outside the batch loop (in a barrier, an evaluation): the barriers until the
        # loop replays the epoch's batches are skipped (the other trainers replay them too).
        self.replay_pending = False
        self.void_step = False           # the forward of this step ran before a rollback
        self._barrier_counts: dict[str, int] = {}
        self._resumed_barriers: set[str] = set()   # counts from a checkpoint, not yet passed here
        self._saved_step: int | None = None
        self._restore: Restore | None = None

    # -- steps and checkpoints ------------------------------------------------------
    def advance(self) -> None:
        """A step went out."""
        self.step += 1

    def saved(self) -> None:
        """A checkpoint of this step was written."""
        self._saved_step = self.step

    @property
    def unsaved(self) -> bool:
        """The latest checkpoint is not at this step."""
        return self._saved_step != self.step

    def take_void_step(self) -> bool:
        """True once for a step whose forward ran before a rollback: nothing of it counts."""
        void, self.void_step = self.void_step, False
        return void

    def replay_starts(self) -> None:
        """The batch loop goes on from the rolled-back position: what was void is over."""
        self.replay_pending = False
        self.void_step = False

    # -- barriers -------------------------------------------------------------------
    def barrier_counts(self) -> dict[str, int]:
        return dict(self._barrier_counts)

    def joined_at(self, step: int, barrier_counts: dict[str, int]) -> None:
        """A trainer that joined a running job: its first step is the servers' next one, and its
        barriers and broadcasts go on at the job's counts (server/services/trainer_barrier.py)."""
        self.step = step
        self._barrier_counts = dict(barrier_counts)

    def meet(self, name: str, wait: Callable[[int, bool], object]):
        """Barrier (or broadcast) ``name`` once more: ``wait(count, resumed)`` does it; the count
        is taken only once it passed, so a failed wait is retried with the same count."""
        count = self._barrier_counts.get(name, 0) + 1
        out = wait(count, name in self._resumed_barriers)
        self._barrier_counts[name] = count
        self._resumed_barriers.discard(name)
        return out

    # -- the batch loop (trainer/loop.py) at this step and these counts ---------------
    def begin_epoch(self, epoch: int) -> None:
        self.loop.begin_epoch(epoch, self.step, self._barrier_counts)

    def batches(self, loader):
        return self.loop.batches(loader, self.step, self._barrier_counts)

    def loop_json(self) -> dict | None:
        """The loop's position at this step, as a checkpoint saves it (None outside a loop)."""
        return self.loop.as_json(self.step, self._barrier_counts)

    # -- resume and rollback --------------------------------------------------------
    @property
    def recoveries(self) -> int:
        """Rollbacks so far (``launch --max-restarts``)."""
        return self.recovery.used

    def resume(self, ckpt, servers_step: int | None = None) -> None:
        """Step, position, state, barrier counts and random streams as they were at the checkpoint
        ``ckpt``; without one on this host (None), at ``servers_step`` (the step the servers' dense
        version stands for, when versions count steps)."""
        if ckpt is not None:
            self.step = ckpt.step
            self.position = ckpt.trainer_position(self.trainer_id) or {}
            self.state = dict(self.position.get("state") or {})
        elif servers_step is not None:
            self.step = servers_step
        loop = self.loop
        if self.position.get("loop"):
            loop.load(self.position["loop"], self.step)
            self._barrier_counts = dict(loop.barrier_counts)
        elif loop.active:
            # No position file here (another host): the rollback stays in this epoch (epochs()
            # saves at every epoch's start), whose barrier counts are known.
            self._barrier_counts = dict(loop.barrier_counts)
        self._resumed_barriers = set(self._barrier_counts)
        restore_random_streams(self.position)
        self._saved_step = self.step
        log.info("trainer %d resumes at step %d%s", self.trainer_id, self.step,
                 "" if self.position else " (no saved position for this trainer: data and random streams "
                                          "start afresh)")

    def restore_with(self, restore: Restore) -> None:
        """How the servers go back to the latest checkpoint (the Trainer's backend)."""
        self._restore = restore

    def roll_back(self, exc: ParamshardError) -> None:
        """A server died and the launcher restarts it in place: roll back to the latest checkpoint
        with every other trainer. Re-raises ``exc`` when recovery is off or spent."""
        if self._restore is None:       # failed before the Trainer started: nothing to go back to
            raise exc
        policy = self.recovery
        number = policy.take(exc)
        failed_at = self.step
        log.warning("trainer %d: %s; waiting for the servers, then rolling back to the latest checkpoint "
                    "(recovery %d of %d)", self.trainer_id, exc, number, policy.max_restarts)
        self.replay_pending = self.loop.active   # the batch loop replays; barriers until then are void
        ckpt, servers_step = self._restore()
        self.position = {}
        self.resume(ckpt, servers_step)
        log.warning("trainer %d: rolled back from step %d to checkpoint step %d: %s", self.trainer_id, failed_at,
                    self.step, self.replay_plan(failed_at))

    def roll_back_in_forward(self, exc: ParamshardError) -> None:
        """A forward's rows failed: roll back; this forward's batch belongs to a step that was
        rolled back, so its step() is void."""
        self.roll_back(exc)
        self.void_step = True

    def roll_back_outside_loop(self, exc: ParamshardError) -> None:
        """A barrier, broadcast or learning-rate change failed: roll back; the calls until the batch
        loop replays are void (the epoch's code runs again, and these calls with it)."""
        self.roll_back(exc)
        self.replay_pending = True

    def leave(self, leave: Callable[[], None]) -> None:
        """The trainer's leave, after its final checkpoint. A server killed and restarted in place
        since then refuses it (it holds nothing yet: taking the leave would end the job as if it
        held the trained model, its deltas and final state short of the checkpoint): roll back to
        the latest checkpoint, the final one, so nothing is trained again, and leave again."""
        while True:
            try:
                leave()
                return
            except ParamshardError as exc:
                step = self.step
                self.roll_back(exc)          # re-raises unless the recovery policy admits it
                if self.step != step:
                    raise ParamshardError(
                        f"trainer {self.trainer_id}: a server restarted while this trainer left, and the latest "
                        f"checkpoint is at step {self.step}, not its last step {step}: the steps between are on "
                        f"no server. Run the job again with --resume; it goes on from step {self.step}") from exc

    def replay_plan(self, failed_at: int) -> str:
        """What the rollback makes the script train again, in its own words."""
        lost = failed_at - self.step
        loop = self.loop
        if loop.active:
            where = f"epoch {loop.epoch}, " if loop.epoch is not None else ""
            batch = self.step - (loop.start_step or 0)
            return (f"{lost} steps are trained again: the batch loop goes on from {where}batch {batch} "
                    f"(trainer.prefetching replays them)")
        return (f"{lost} steps are trained again if the script's loop follows trainer.step_count; a plain "
                f"'for batch in loader' loop does not replay them (use trainer.epochs() and "
                f"trainer.prefetching(loader))")
