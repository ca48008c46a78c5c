"""Where a Trainer is after a resume or a rollback: its step, position and barriers.

``resume_position`` puts a Trainer at a checkpoint's step (``resume=``, or after a
rollback); ``roll_back`` is what a Trainer does when its RecoveryPolicy
(client/recovery.py) admits a failure: every server back at the latest
checkpoint (the backend's part), then this trainer's own state back with it.
"""
from __future__ import annotations

from paramshard.errors import ParamshardError
from paramshard.log import get_logger
from paramshard.trainer.position import restore_random_streams

log = get_logger("trainer")


def resume_position(trainer, ckpt, version: int) -> None:
    """Step count and random streams as they were at the checkpoint."""
    if ckpt is not None:
        trainer.step_count = ckpt.step
        trainer.position = ckpt.trainer_position(trainer.trainer_id) or {}
        trainer.state = dict(trainer.position.get("state") or {})
    else:       # the checkpoint is not on this host: the servers know the step (if versions count steps)
        step = trainer.backend.step_of_version(version)
        if step is not None:
            trainer.step_count = step
    loop = trainer.loop
    if trainer.position.get("loop"):
        loop.load(trainer.position["loop"], trainer.step_count)
        trainer._barrier_counts = dict(loop.barrier_counts)
    elif loop.active:
        # No position file here (another host): the rollback stays in this epoch (epochs()
        # saves at every epoch's start), whose barrier counts are known.
        trainer._barrier_counts = dict(loop.barrier_counts)
    trainer._resumed_barriers = set(trainer._barrier_counts)
    restore_random_streams(trainer.position)
    trainer._saved_step = trainer.step_count
    log.info("trainer %d resumes at step %d%s", trainer.trainer_id, trainer.step_count,
             "" if trainer.position else " (no saved position for this trainer: data and random streams "
                                         "start afresh)")


def roll_back(trainer, exc: ParamshardError) -> None:
    """A server died and the launcher restarts it in place: roll back to the latest
    checkpoint with every other trainer. Re-raises ``exc`` when recovery is off or spent."""
    policy = trainer.recovery
    number = policy.take(exc)
    env = trainer.env
    failed_at = trainer.step_count
    log.warning("trainer %d: %s; waiting for the servers, then rolling back to the latest checkpoint "
                "(recovery %d of %d)", trainer.trainer_id, exc, number, policy.max_restarts)
    trainer.replay_pending = trainer.loop.active   # the batch loop replays; barriers until then are void
    ckpt, version = trainer.backend.roll_back(trainer._values, trainer.optimizer, trainer.table_specs(),
                                              env.checkpoint_dir, trainer.is_chief, env.timeout)
    trainer.position = {}
    resume_position(trainer, ckpt, version)
    trainer.drop_gradients()
    log.warning("trainer %d: rolled back from step %d to checkpoint step %d: %s", trainer.trainer_id, failed_at,
                trainer.step_count, replay_plan(trainer, failed_at))


def replay_plan(trainer, failed_at: int) -> str:
    """What the rollback makes the script train again, in its own words."""
    lost = failed_at - trainer.step_count
    loop = trainer.loop
    if loop.active:
        where = f"epoch {loop.epoch}, " if loop.epoch is not None else ""
        batch = trainer.step_count - (loop.start_step or 0)
        return (f"{lost} steps are trained again: the batch loop goes on from {where}batch {batch} "
                f"(trainer.prefetching replays them)")
    return (f"{lost} steps are trained again if the script's loop follows trainer.step_count; a plain "
            f"'for batch in loader' loop does not replay them (use trainer.epochs() and "
            f"trainer.prefetching(loader))")
