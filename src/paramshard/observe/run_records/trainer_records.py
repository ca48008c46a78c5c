"""A trainer's progress records: steps, samples/s, loss, the user's own metrics and
where a step's time goes (pull / compute / push), about once a second.

The Trainer's listener (trainer_watch.TrainerWatch.after_step) calls ``on_step`` after each step; users add values with
``trainer.log(loss=..., epoch=..., total_steps=..., **metrics)``, and a program's final
figures with ``trainer.log(result={...})`` (a JSON object: the next record carries it as
``result``, and `paramshard report` prints the latest first). A record holds the
latest value of each metric (``metrics``) and, in ``logged``, every ``trainer.log`` call
since the previous record with the step and epoch it was made at: a value logged once an
epoch is never lost between two records, nor filed under the next epoch. Under
``paramshard launch`` (PARAMSHARD_RECORDS=stdout) each record is one stdout
line behind ``records.MARK``, which the launcher takes out of the output and
writes to the run directory; with no launcher nothing is printed.

Samples per step: the first dimension of the first tensor the model's forward
got (a forward pre-hook), unless the script logs ``samples=``.
"""
from __future__ import annotations

import json
import sys
import time

import torch
from torch.utils.hooks import RemovableHandle

from paramshard.observe.run_records.batch_size import watch_batch_size
from paramshard.observe.run_records.records import MARK, TRAINER_EVERY

RESERVED = ("loss", "epoch", "total_steps", "samples", "result")
# What trainer.log() takes that is about the run, not a value to plot: not kept in ``logged``.
NOT_VALUES = ("epoch", "total_steps", "samples", "result")


def logged_values(values: dict) -> dict[str, float]:
    """The plottable values of one trainer.log call (None and the run's own fields left out)."""
    return {k: float(v) for k, v in values.items() if k not in NOT_VALUES and v is not None}


class TrainerRecords:
    def __init__(self, trainer_id: int, emit=None, every: float = TRAINER_EVERY, clock=time.monotonic,
                 wall=time.time):
        self.trainer_id, self.every, self.clock, self.wall = trainer_id, every, clock, wall
        self.emit = emit or _print_record
        self.samples = 0
        self.batch: int | None = None          # samples of the last forward (pre-hook)
        self.logged_samples: int | None = None
        self.epoch: float | None = None                 # as the script logs it (a whole or part epoch)
        self.total_steps: int | None = None
        self.metrics: dict = {}
        self.result: dict | None = None                 # trainer.log(result=...) not yet in a record
        self._losses: list[float] = []
        self._last_t = clock()
        self._last_step = self._last_samples = 0
        self._waits = self._last_waits = (0.0, 0.0)     # cumulative (rows, push replies) waits
        self._logged = False                            # trainer.log() since the last record
        self._log_calls: list[dict] = []                # each trainer.log() call since the last record
        self._rates = (0.0, 0.0)                        # (samples/s, steps/s) of the last record
        self.step = 0
        self._step_at: float | None = None              # clock of the previous step's end
        self._step_end_t: float | None = None           # wall time of the last step's end (unix s)
        self.step_max_s = 0.0                           # longest step since the last record (a stall)
        self.staleness_max: int | None = None
        self._hook: RemovableHandle | None = None      # on the model watched (watch)
        self._closed = False

    def watch(self, model: torch.nn.Module) -> None:
        def note(samples: int) -> None:
            self.batch = samples
        self._hook = watch_batch_size(model, note)

    def log(self, **values) -> None:
        self._logged = True
        if "loss" in values and values["loss"] is not None:
            self._losses.append(float(values["loss"]))
        if "epoch" in values:
            self.epoch = values["epoch"]
        if "total_steps" in values:
            self.total_steps = int(values["total_steps"])
        if "samples" in values:
            self.logged_samples = int(values["samples"])
        if values.get("result") is not None:
            if not isinstance(values["result"], dict):
                raise TypeError(f"trainer.log(result=...) takes a dict of the run's figures, got "
                                f"{type(values['result']).__name__}")
            self.result = values["result"]
        for key, value in values.items():
            if key not in RESERVED:
                self.metrics[key] = float(value)
        kept = logged_values(values)
        if kept:
            # The step is the count of steps done when it was logged: the x of its point.
            self._log_calls.append({"t": time.time(), "step": self.step, "epoch": self.epoch, "values": kept})

    def on_step(self, step: int, loss: torch.Tensor | None, pull_wait_s: float, push_wait_s: float,
                staleness: int | None = None) -> None:
        """After ``step()``: ``step`` steps done; the trainer's cumulative waits for rows
        (``pull_wait_s``) and for push replies (``push_wait_s``); the staleness the servers
        reported for the latest push."""
        self.step = step
        now = self.clock()
        if self._step_at is not None:
            self.step_max_s = max(self.step_max_s, now - self._step_at)
        self._step_at = now
        self._step_end_t = self.wall()
        self.samples += self.logged_samples or self.batch or 0
        self.logged_samples = None
        if loss is not None:
            self._losses.append(float(loss.detach()))
        self._waits = (pull_wait_s, push_wait_s)
        if staleness is not None:
            self.staleness_max = max(self.staleness_max or 0, staleness)
        if self.clock() - self._last_t >= self.every:
            self.flush()

    def flush(self, done: bool = False) -> None:
        """A record of what happened since the previous one; ``done``: the trainer's last (its
        steps are over), written even with nothing new, so a reader knows it finished rather
        than stalled."""
        now = self.clock()
        steps = self.step - self._last_step
        if steps <= 0 and not self._logged and not done:
            return
        dt = max(now - self._last_t, 1e-9)
        per = max(steps, 1)         # values logged after the last step: a record with no new step
        pull = (self._waits[0] - self._last_waits[0]) / per
        push = (self._waits[1] - self._last_waits[1]) / per
        record = {
            "kind": "trainer", "t": self.wall(), "trainer": self.trainer_id, "step": self.step,
            "samples": self.samples,
            # A record of values logged after the last step keeps the rates of the one before.
            "samples_per_s": round((self.samples - self._last_samples) / dt, 2) if steps else self._rates[0],
            "steps_per_s": round(steps / dt, 4) if steps else self._rates[1],
            "loss": sum(self._losses) / len(self._losses) if self._losses else None,
            "epoch": self.epoch, "total_steps": self.total_steps, "metrics": dict(self.metrics),
            "phases": {"pull": round(pull, 6), "compute": round(max(dt / per - pull - push, 0.0), 6) if steps else 0.0,
                       "push": round(push, 6)},
            "staleness_max": self.staleness_max,
            "step_max_s": round(self.step_max_s, 6),
            # When the last step ended: with step_max_s, where each record's steps lie in time, and
            # for a trainer whose records stop, since when it has not finished a step.
            "step_end_t": None if self._step_end_t is None else round(self._step_end_t, 3),
            **({"done": True} if done else {}),
            **({"result": self.result} if self.result is not None else {}),
            "logged": self._log_calls,
        }
        self.emit(record)
        self._rates = (record["samples_per_s"], record["steps_per_s"])
        self._losses, self.staleness_max, self._logged, self._log_calls = [], None, False, []
        self.result = None
        self.step_max_s = 0.0
        self._last_t, self._last_step, self._last_samples = now, self.step, self.samples
        self._last_waits = self._waits

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.flush(done=True)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def _print_record(record: dict) -> None:
    sys.stdout.write(MARK + json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()
