"""What a GEO job's round records (``geo_round``, geo/records.py) say, for `paramshard report`:
k over time, bytes on the wire (in total and per sample), the staleness histogram, and the
cumulative bytes at which each validation figure was logged.

Every function takes a RunData (run_data.load_run) and reads only its records; a record with
a field missing or not a number is left out of what needs that field.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from paramshard.observe.run_records.run_data import RunData

# The validation figure the bytes are plotted against, first found wins: the CTR app logs
# valid_auc (with a validation set) and test_auc once an epoch (apps/ctr/training.py), a
# streaming run progressive_auc.
AUC_NAMES = ("valid_auc", "auc", "test_auc", "progressive_auc")


def _n(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def has_geo(run: RunData) -> bool:
    return any(run.geo_rounds.values())


def k_over_time(run: RunData) -> dict[int, list[tuple[float, int, int]]]:
    """Per trainer: (seconds since the run's first record, step, k of the round) per round."""
    t0 = run.t0 or 0.0
    return {trainer: [(r["t"] - t0, int(r.get("step") or 0), int(r["k"])) for r in rounds if _n(r.get("k")) is not None]
            for trainer, rounds in run.geo_rounds.items()}


def bytes_total(run: RunData) -> int:
    return int(sum(_n(r.get("bytes")) or 0 for rounds in run.geo_rounds.values() for r in rounds))


def samples_total(run: RunData) -> int | None:
    """Samples the trainers trained (each one's latest progress record), None when none says."""
    latest = [_n(records[-1].get("samples")) for records in run.trainers.values() if records]
    counts = [c for c in latest if c is not None]
    return int(sum(counts)) if counts else None


def bytes_per_sample(run: RunData) -> float | None:
    samples = samples_total(run)
    return bytes_total(run) / samples if samples else None


def staleness_histogram(run: RunData) -> dict[int, int]:
    """Rounds by their staleness (the local steps a replica was behind when it sent), all trainers."""
    out: dict[int, int] = {}
    for rounds in run.geo_rounds.values():
        for r in rounds:
            s = _n(r.get("staleness"))
            if s is not None:
                out[int(s)] = out.get(int(s), 0) + 1
    return dict(sorted(out.items()))


@dataclass
class TrainerRounds:
    trainer: int
    rounds: int
    steps: int
    first_k: int
    last_k: int           # the k chosen after its last round (next_k), else its last round's
    min_k: int
    max_k: int
    bytes: int
    # Seconds the sends took from training / (those + compute seconds) over all its rounds: the
    # whole wire time when the sends block, what was not overlapped with training when they do not
    # (a record's blocked_s; older records have none: their wire_s).
    wire_share: float | None


def per_trainer(run: RunData) -> list[TrainerRounds]:
    out = []
    for trainer, rounds in run.geo_rounds.items():
        ks = [int(r["k"]) for r in rounds if _n(r.get("k")) is not None]
        if not ks:
            continue
        wire = sum(_n(r.get("blocked_s", r.get("wire_s"))) or 0.0 for r in rounds)
        compute = sum(_n(r.get("compute_s")) or 0.0 for r in rounds)
        last = _n(rounds[-1].get("next_k"))
        out.append(TrainerRounds(trainer, len(ks), sum(ks), ks[0], int(last) if last is not None else ks[-1],
                                 min(ks), max(ks), int(sum(_n(r.get("bytes")) or 0 for r in rounds)),
                                 wire / (wire + compute) if wire + compute > 0 else None))
    return out


def _logged(run: RunData, name: str) -> list[tuple[float, float]]:
    """(t, value) of every trainer.log call that logged ``name``, any trainer, in time order."""
    points = []
    for records in run.trainers.values():
        for record in records:
            calls = record.get("logged")
            for call in calls if isinstance(calls, list) else []:
                if not isinstance(call, dict) or not isinstance(call.get("values"), dict):
                    continue
                t, value = _n(call.get("t")), _n(call["values"].get(name))
                if t is not None and value is not None:
                    points.append((t, value))
    return sorted(points)


def bytes_against_metric(run: RunData) -> tuple[str | None, list[tuple[int, float]]]:
    """(the figure's name, [(bytes on the wire by the time it was logged, value)]): the first
    of AUC_NAMES any trainer logged, else the trainers' training loss (name ``loss``), else
    (None, [])."""
    rounds = sorted((r["t"], _n(r.get("bytes")) or 0.0) for rs in run.geo_rounds.values() for r in rs)
    times, cumulative, total = [t for t, _ in rounds], [], 0.0
    for _, b in rounds:
        total += b
        cumulative.append(total)

    def at(t: float) -> int:
        i = bisect.bisect_right(times, t)
        return int(cumulative[i - 1]) if i else 0

    for name in AUC_NAMES:
        points = _logged(run, name)
        if points:
            return name, [(at(t), v) for t, v in points]
    losses = sorted((r["t"], v) for records in run.trainers.values() for r in records
                    if (v := _n(r.get("loss"))) is not None)
    return ("loss", [(at(t), v) for t, v in losses]) if losses else (None, [])
