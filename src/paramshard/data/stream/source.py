"""The one protocol every live event source implements, so the trainer and the CTR app never
know whether events come from a directory of growing files or from Kafka.

A source hands out records in order with the *position after them*: a small JSON-able dict
(file names and byte offsets, or Kafka partitions and offsets). The trainer saves the position of
the last batch it trained with each checkpoint and gives it back to ``seek`` on resume or
recovery, so a resumed job neither skips nor repeats an event; ``commit`` tells the source that a
checkpoint holding that position is durable (Kafka commits its consumer offsets then; a directory
source needs nothing). Several trainers of one job each open the same source with their rank:
every record goes to exactly one of them.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import pandas as pd


@dataclasses.dataclass
class StreamBatch:
    records: pd.DataFrame          # the events, one row each, columns as the schema names them
    position: dict                 # where the source stands after these records (JSON-able)
    arrived: float | None = None   # unix seconds the oldest record was appended/produced, if known


@runtime_checkable
class StreamSource(Protocol):
    def poll(self, max_records: int, timeout: float) -> StreamBatch | None:
        """Up to ``max_records`` records after the current position, waiting at most
        ``timeout`` seconds for the first; None when none arrived in time (the stream is live:
        no record yet is not its end)."""

    def position(self) -> dict:
        """The position after the last record ``poll`` returned (JSON-able)."""

    def seek(self, position: dict) -> None:
        """Continue after ``position`` (one ``position()`` gave, saved with a checkpoint)."""

    def commit(self, position: dict) -> None:
        """A checkpoint holding ``position`` is durable: events before it are never needed again."""

    def close(self) -> None:
        """Release files, sockets and threads; idempotent."""
