"""The CTR app in an elastic job (``launch --trainers MIN:MAX``, ``paramshard scale --trainers N``).

- The data: the shard service on server 0 hands --train out as tasks (DynamicShards), so
  a trainer that leaves hands back what it did not train and one that joins takes a share;
  the validation hold-out is by a hash of each row's fields (data/shards/holdout.py
  ``by="content"``), which a task's reader can apply, so every row of --train is trained
  or held out, exactly once per epoch, whoever trained it. (A static job keeps its
  shards and its hold-out by row number: its results do not change.)
- A trainer asked to leave ends its epoch's batch loop at the next step boundary and
  closes: it does not enter the epoch-end barrier, which the others would never reach in
  sync mode (each step waits for it) and async would wait on it needlessly.
- A trainer that joins goes on at the job's barrier counts (server/services/trainer_barrier.py): the
  epoch whose selection is not yet decided is its epoch; if the others passed that
  epoch's end already (trainer 0 is evaluating), it only waits for the decision.
- Trainer 0 cannot be replaced: it holds the run's validation history and best model.
"""
from __future__ import annotations

from paramshard.data.shards.dynamic import DynamicShards
from paramshard.data.shards.holdout import Holdout
from paramshard.data.readers.tabular import TabularReader, count_records
from paramshard.errors import ConfigError

END, SELECTION = "epoch-end", "selection"      # the names of the app's two per-epoch meetings


def is_elastic(env) -> bool:
    return env.min_trainers is not None


def refuse(args, env, schema) -> None:
    """The elastic combinations that cannot work, each with why (raised by every trainer at its start)."""
    if not is_elastic(env):
        return
    if env.joining and env.trainer_id == 0:
        raise ConfigError("trainer 0 of the CTR app cannot be replaced in a running job: it keeps the run's "
                          "validation history and the best epoch's model, which a new process would not have; "
                          "the job cannot go on (launch it again, with --checkpoint-dir to --resume)")
    if schema.format.type == "libsvm" and args.valid is None and args.valid_fraction > 0:
        raise ConfigError("an elastic CTR job holds validation rows out by a hash of their fields, which the libsvm "
                          "preset does not have: give --valid FILES or --valid-fraction 0")


def holdout(args, elastic: bool) -> Holdout | None:
    if args.valid is not None or args.valid_fraction <= 0:
        return None
    # holdout_seed: a refit's repeated hold-outs (refit.py) draw other rows, the model the same.
    seed = getattr(args, "holdout_seed", None)
    return Holdout(args.valid_fraction, args.seed if seed is None else seed, by="content" if elastic else "record")


def train_loader(args, schema, rows: Holdout | None, trainer) -> DynamicShards:
    from paramshard.apps.ctr.training import training_side
    reader = TabularReader(args.train, schema, args.batch_size, skip_bad_lines=args.skip_bad_lines, holdout=rows,
                           side=training_side(args))
    return DynamicShards(reader, task_bytes=args.task_bytes, trainer=trainer)


def steps_estimate(args, schema, env) -> int:
    """Steps per epoch per trainer if every trainer stays: the progress bar's and ETA's length
    (a task queue has no fixed number of batches per trainer)."""
    rows = count_records(args.train, schema)
    if args.valid is None and args.valid_fraction > 0:
        rows = int(rows * (1 - args.valid_fraction))
    return max(1, -(-rows // (args.batch_size * max(env.num_trainers, 1))))


def joined_at(trainer) -> tuple[int, bool]:
    """A joiner's epoch, from the barrier counts it joined at, and whether the job passed that
    epoch's end already (then it trains nothing of it and only takes trainer 0's decision)."""
    counts = trainer.barrier_counts()
    epoch = counts.get(SELECTION, 0) + 1
    if counts.get(END, 0) not in (epoch - 1, epoch):
        raise ConfigError(f"trainer {trainer.trainer_id} joined at barrier counts {counts}: the CTR app meets at "
                          f"{END!r} then {SELECTION!r} once per epoch, so they differ by at most one")
    return epoch, counts.get(END, 0) == epoch
