"""``Trainer.save``: a checkpoint of the whole job at the trainer's step.

The chief has the backend write what the servers hold (client/checkpoint.py);
every trainer writes its own position (random streams, where its batch loop is,
the script's ``state``, and the position of the live stream it trains on: the one after
the last batch this step trained, committed to the stream once the file is written;
data/stream/reader.py), so a resume or a rollback finds its place in the data."""
from __future__ import annotations

from paramshard.checkpoint.format import write_trainer_position
from paramshard.log import get_logger
from paramshard.specs.model_spec import spec_of
from paramshard.trainer import trainer_config
from paramshard.trainer.position import capture

log = get_logger("trainer")


def save(trainer, directory=None, state: dict | None = None) -> None:
    env = trainer.env
    directory = directory or env.checkpoint_dir
    trainer_config.check_save(env, directory)
    trainer.backend.flush()       # every step up to this one is on the servers
    # This trainer's position is written before the chief commits the servers' state, which moves
    # ``latest``: a kill between the two (kill -9 mid-save) then leaves ``latest`` at the previous
    # checkpoint (its position whole) and a position file of a step never committed (harmless: a
    # save of that step writes it again), never a latest checkpoint without the chief's position,
    # which a stream's --resume must refuse (the records since would be trained again).
    position = capture(trainer.step_count, state if state is not None else trainer.state)
    loop = trainer.progress.loop_json()
    if loop is not None:
        position["loop"] = loop
    stream = trainer.progress.stream
    if stream is not None:
        position["stream"] = stream.position_at(trainer.step_count)
    trainer.backend.save_own(directory, trainer.step_count)     # before the position that implies it
    write_trainer_position(directory, trainer.step_count, trainer.trainer_id, position)
    if trainer.is_chief:
        settings = {"mode": env.mode, "trainers": env.num_trainers, "job_id": env.job_id}
        spec = spec_of(trainer.model)       # what built the model: export-model and predict need no code
        if spec is not None:
            settings["model"] = spec
        path, nbytes, seconds = trainer.backend.save(trainer.table_specs(), directory, trainer.step_count, settings,
                                                     env.checkpoint_keep)
        log.info("checkpoint %s: %.1f MB in %.2f s (%.0f MB/s)", path, nbytes / 1e6, seconds,
                 nbytes / 1e6 / max(seconds, 1e-9))
    trainer.progress.saved()
    if stream is not None:
        stream.saved(position["stream"])       # committed to the source only once the checkpoint is


def due(trainer) -> bool:
    """``checkpoint_every`` says the step just taken ends with a checkpoint."""
    every = trainer.env.checkpoint_every
    return bool(every and trainer.env.checkpoint_dir and trainer.step_count % every == 0)


def unsaved(trainer) -> bool:
    """Checkpoints are on and the latest one is not at this step (the final one is due at close)."""
    return bool(trainer.env.checkpoint_dir) and trainer.progress.unsaved
