"""A GEO trainer's round records: one ``geo_round`` record a round, in the run directory beside
the trainer's progress records (layout: observe/run_records/records.py), for `paramshard
report`'s GEO section (k over time, bytes on the wire, the staleness histogram:
observe/run_records/geo_view.py).

A record: ``{"kind": "geo_round", "t": unix s (when the send ended), "trainer": 0, "step": n
(local steps done after this round), "k": steps of this round, "next_k": the k the schedule
chose next, "bytes": payload bytes on the wire both ways, "wire_s": s, "compute_s": s,
"blocked_s": s (what the round took from training: all of wire_s when the send blocks),
"pieces": pushes the round went out in (overlapped: one per step boundary, geo/flight.py),
"staleness": steps (how far, in its own steps, the replica had fallen behind the merged
values when this merge landed: the round's k when the send blocks), "delta_norm", "value_norm", "drift_norm",
"settled_value_norm", "settled_drift_norm" (the same over the settled values: geo/schedule.py Round)}``.

They travel as the progress records do: under ``paramshard launch`` (PARAMSHARD_RECORDS=stdout)
one stdout line behind ``records.MARK`` each, which the launcher writes to metrics.jsonl; with
``paramshard run --run-dir DIR`` (``dir:DIR``) the trainer appends them to
``DIR/metrics/geo-trainer-N.jsonl`` (its own file: the progress records' file has its own writer).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable

from paramshard.geo.schedule import Round
from paramshard.observe.run_records.records import MARK, RecordWriter

KIND = "geo_round"


def round_record(trainer_id: int, done: Round, next_k: int, step: int, t: float) -> dict:
    return {"kind": KIND, "t": t, "trainer": trainer_id, "step": int(step), "k": int(done.steps),
            "next_k": int(next_k), "bytes": int(done.bytes_sent), "wire_s": round(done.wire_seconds, 6),
            "compute_s": round(done.compute_seconds, 6),
            "blocked_s": round(done.wire_seconds if done.blocked_seconds is None else done.blocked_seconds, 6),
            "pieces": int(done.pieces),
            "staleness": int(done.steps if done.staleness is None else done.staleness),
            "delta_norm": done.delta_norm, "value_norm": done.value_norm, "drift_norm": done.drift_norm,
            "settled_value_norm": done.settled_value_norm, "settled_drift_norm": done.settled_drift_norm}


class RoundRecords:
    """``add`` after every round (the GEO backend's on_round). ``run_dir``: the directory of
    ``paramshard run --run-dir``, or None under ``paramshard launch`` (stdout, for the launcher);
    ``emit``: where records go instead (tests)."""

    def __init__(self, run_dir: str | Path | None, trainer_id: int, emit: Callable[[dict], None] | None = None):
        self.trainer_id = trainer_id
        self._writer = None
        if emit is None and run_dir is not None:
            self._writer = RecordWriter(Path(run_dir) / "metrics" / f"geo-trainer-{trainer_id}.jsonl")
            emit = self._writer.write
        self.emit = emit or _print_record

    @classmethod
    def for_env(cls, env) -> "RoundRecords | None":
        """The records a rank's contract asks for (PARAMSHARD_RECORDS), or None: no records."""
        records = getattr(env, "records", None)
        if not records:
            return None
        return cls(records[len("dir:"):] if records.startswith("dir:") else None, env.trainer_id)

    def add(self, done: Round, next_k: int, step: int, t: float | None = None) -> None:
        self.emit(round_record(self.trainer_id, done, next_k, step, time.time() if t is None else t))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _print_record(record: dict) -> None:
    sys.stdout.write(MARK + json.dumps(record, separators=(",", ":"), default=float) + "\n")
    sys.stdout.flush()
