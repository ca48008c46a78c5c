"""Where a stream run stands, kept with the checkpoints: the one place the CTR app saves a
StreamSource's position, seeks it on resume and after a rollback, and commits it once a
checkpoint holding it is written (data/stream/source.py says what each of those means).

The position after a batch goes into ``trainer.state`` before that batch's step, so the
checkpoint a step writes (checkpoint_every, or close()'s final one) holds exactly the events
its model trained on: a resumed or rolled-back job seeks there and neither skips nor repeats
one. The count of events trained so far rides along (the --max-events budget and the run's
figures go on from it)."""
from __future__ import annotations

KEY = "stream"


class StreamPosition:
    def __init__(self, trainer, source):
        self.trainer, self.source = trainer, source
        self.start = source.position()           # where a job with no checkpoint yet goes back to
        self._recoveries = trainer.recoveries
        self._committed: dict | None = None

    def resume(self) -> int:
        """After ``--resume``: the source at the checkpoint's position; the events trained before it."""
        saved = self.trainer.state.get(KEY)
        if saved:
            self.source.seek(saved["position"])
            return int(saved["events"])
        return 0

    def trained(self, position: dict, events: int) -> None:
        """The batch about to step ends at ``position``, ``events`` trained with it."""
        self.trainer.state[KEY] = {"position": position, "events": events}

    def after_step(self) -> int | None:
        """After each step: a rollback (``launch --max-restarts``) puts the trainer's state back at
        the checkpoint, and the source goes back there too (returns the events trained by then);
        a checkpoint written at this step is durable: the source may forget what came before it."""
        trainer = self.trainer
        if trainer.recoveries != self._recoveries:
            self._recoveries = trainer.recoveries
            saved = trainer.state.get(KEY)
            self.source.seek(saved["position"] if saved else self.start)
            return int(saved["events"]) if saved else 0
        if trainer.env.checkpoint_dir and not trainer.progress.unsaved:
            self.commit()
        return None

    def commit(self) -> None:
        """The latest checkpoint's position committed (once); nothing without checkpoints: no
        checkpoint holds it, and a Kafka group's offsets must not say more than one does."""
        saved = self.trainer.state.get(KEY)
        if self.trainer.env.checkpoint_dir and saved and saved["position"] != self._committed:
            self.source.commit(saved["position"])
            self._committed = saved["position"]
