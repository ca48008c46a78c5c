"""What watches a Trainer's steps: the progress records for the launcher's run
directory (trainer_records.py) and the /metrics endpoint (prometheus.py). The
Trainer holds one of these and calls it; it holds the details."""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard.observe.live.prometheus import trainer_metrics
from paramshard.observe.run_records.rank_records import TrainerSink, run_dir_of
from paramshard.observe.run_records.trainer_records import RESERVED, TrainerRecords


class TrainerWatch:
    def __init__(self, env, model):
        run_dir = run_dir_of(env)
        # `paramshard run --run-dir`: this trainer writes its own records and TensorBoard files;
        # under `paramshard launch` they go on stdout and the launcher writes both.
        self.sink = TrainerSink(run_dir, env.trainer_id) if run_dir is not None else None
        self.records = TrainerRecords(env.trainer_id, emit=self.sink) if env.records else None
        if self.records is not None:
            self.records.watch(model)
        try:
            self.metrics = trainer_metrics(env, model)
        except BaseException:
            self.close()
            raise

    def log(self, **values) -> None:
        if self.records is not None:
            self.records.log(**values)
        if self.metrics is not None:
            for key, value in values.items():
                if key not in RESERVED and value is not None:
                    self.metrics.set_metric(key, float(value))

    def after_step(self, step: int, loss, pipeline, staleness: int | None) -> None:
        """``pipeline``: the step client's cumulative PipelineStats."""
        if self.records is not None:
            self.records.on_step(step, loss, pipeline["pull_wait_s"], pipeline["push_wait_s"], staleness)
        if self.metrics is not None:
            self.metrics.observe_pipeline(pipeline, loss)

    def close(self) -> None:
        if self.records is not None:
            self.records.close()
        if getattr(self, "sink", None) is not None:
            self.sink.close()
            self.sink = None
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()


if TYPE_CHECKING:   # `make typecheck` checks the contract: TrainerListener (events.py)
    from paramshard.events import TrainerListener
    _trainer_listener: type[TrainerListener] = TrainerWatch
