"""The run directory's records as TensorBoard event files, so ``tensorboard --logdir
RUN_DIR/tensorboard`` shows a job as it runs:

- ``tensorboard/trainer-N/``: every value the script passed to ``trainer.log`` under its
  own name (``test_auc``...) at the step it was logged, and the trainer's own series:
  ``trainer/loss`` (mean since its previous record), ``trainer/samples_per_s``,
  ``trainer/steps_per_s``, ``trainer/epoch``, ``trainer/staleness_max`` and the step
  phases ``trainer/pull_s``, ``trainer/compute_s``, ``trainer/push_s``, at the record's step;
- ``tensorboard/server-N/``: ``server/requests_per_s``, ``server/requests`` (job totals,
  observe/run_records/counter_carry.py), ``server/rows``, ``server/elements``, ``server/bytes_in``,
  ``server/bytes_out``, ``server/queue_s``, ``server/update_s``, the step being the
  record's number (a server has no steps).

Written with the ``tensorboard`` package's own event-file writer (the format TensorBoard
reads; scalars as ``simple_value``, as ``torch.utils.tensorboard`` writes them), from the
same records as metrics.jsonl: by the launcher for ``paramshard launch`` (the records
reach it on the processes' stdout) and by each rank under ``paramshard run --run-dir``.
The package is imported on the first record, so a process that writes none never pays
for it; if it cannot be imported, one warning and the run goes on without the files.
"""
from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Protocol

from paramshard.log import get_logger

log = get_logger("observe")

TENSORBOARD_DIR = "tensorboard"      # inside the run directory
FLUSH_SECS = 5                       # TensorBoard shows a running job within seconds

TRAINER_SERIES = (("loss", "trainer/loss"), ("samples_per_s", "trainer/samples_per_s"),
                  ("steps_per_s", "trainer/steps_per_s"), ("epoch", "trainer/epoch"),
                  ("staleness_max", "trainer/staleness_max"))
SERVER_SERIES = ("requests_per_s", "requests", "rows", "elements", "bytes_in", "bytes_out", "queue_s", "update_s")


def _value(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _step(x) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else None


def run_of(record: dict) -> str | None:
    """The TensorBoard run (sub-directory) a record belongs to: trainer-N, server-N, or None."""
    kind = record.get("kind")
    who = record.get(kind) if kind in ("trainer", "server") else None
    return f"{kind}-{who}" if _step(who) is not None else None


def trainer_scalars(record: dict) -> list[tuple[str, float, int, float]]:
    """(tag, value, step, wall time) of a trainer record: each logged value at its own step."""
    out = []
    for call in record.get("logged") or ():
        step, values = _step(call.get("step")), call.get("values")
        if step is None or not isinstance(values, dict):
            continue
        t = _value(call.get("t")) or _value(record.get("t")) or time.time()
        out += [(name, v, step, t) for name, v in ((n, _value(x)) for n, x in values.items()) if v is not None]
    step, t = _step(record.get("step")), _value(record.get("t")) or time.time()
    if step is None:
        return out
    series = [(tag, record.get(key)) for key, tag in TRAINER_SERIES]
    phases = record.get("phases")
    if isinstance(phases, dict):
        series += [(f"trainer/{name}_s", seconds) for name, seconds in phases.items()]
    return out + [(tag, v, step, t) for tag, v in ((tag, _value(x)) for tag, x in series) if v is not None]


def server_scalars(record: dict, step: int) -> list[tuple[str, float, int, float]]:
    t = _value(record.get("t")) or time.time()
    return [(f"server/{key}", v, step, t) for key, v in ((k, _value(record.get(k))) for k in SERVER_SERIES)
            if v is not None]


class _EventWriter(Protocol):
    """What is used of tensorboard's EventFileWriter (the package ships no types)."""
    def add_event(self, event: object) -> None: ...
    def close(self) -> None: ...


class TensorBoardWriter:
    """``write(record)`` from any thread; ``close()`` flushes every event file."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._writers: dict[str, _EventWriter] = {}
        self._server_steps: dict[str, int] = {}
        self._lock = threading.Lock()
        self._broken = False
        self._proto: tuple[ModuleType, ModuleType] | None = None     # (event_pb2, summary_pb2), on first use

    def _open(self, run: str) -> tuple[_EventWriter, ModuleType, ModuleType]:
        """The run's writer and the protobuf modules events are made of."""
        if self._proto is None:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            self._proto = (event_pb2, summary_pb2)
        writer = self._writers.get(run)
        if writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
            path = self.root / run
            path.mkdir(parents=True, exist_ok=True)
            writer = self._writers[run] = EventFileWriter(str(path), flush_secs=FLUSH_SECS)
        return writer, *self._proto

    def write(self, record: dict) -> None:
        run = run_of(record)
        if run is None or self._broken:
            return
        with self._lock:
            if record["kind"] == "trainer":
                scalars = trainer_scalars(record)
            else:
                step = self._server_steps[run] = self._server_steps.get(run, -1) + 1
                scalars = server_scalars(record, step)
            if not scalars:
                return
            try:
                writer, event_pb2, summary_pb2 = self._open(run)
            except (ImportError, OSError) as exc:
                self._broken = True
                log.warning("no TensorBoard files in %s (%s): pip install tensorboard", self.root, exc)
                return
            for tag, value, step, t in scalars:
                summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
                writer.add_event(event_pb2.Event(wall_time=t, step=step, summary=summary))

    def close(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers = {}
