"""Kafka message values -> one pandas DataFrame, one row per message.

JSON: each message is one JSON object (one record); the columns are the union of the keys in
the order first seen (a key a record lacks is NaN there). CSV: each message is one line of
fields in the order of the given header, no header line; a column whose every value reads as a
number becomes numeric and an empty field is missing (NaN), as pandas' CSV reader does; the
other columns stay strings.

A message that does not decode raises :class:`MessageError` naming where it is (topic,
partition, offset) unless the stream was opened with ``errors=skip``, which drops it and counts it.
"""
from __future__ import annotations

import csv
import json
from collections.abc import Sequence

import pandas as pd


class MessageError(ValueError):
    """A message that is not one record of the stream's format."""


def decode_json(value: bytes | None) -> dict:
    if value is None:
        raise MessageError("the message has no value (a tombstone?); each message must be one JSON object")
    try:
        record = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageError(f"not JSON ({exc}): {bytes(value[:80])!r}") from None
    if not isinstance(record, dict):
        raise MessageError(f"a JSON {type(record).__name__}, not an object: {bytes(value[:80])!r}; "
                           "each message must be one JSON object (one record)")
    return record


def decode_csv(value: bytes | None, columns: Sequence[str]) -> list[str]:
    if value is None:
        raise MessageError("the message has no value (a tombstone?); each message must be one CSV line")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MessageError(f"not UTF-8 text ({exc}): {bytes(value[:80])!r}") from None
    rows = list(csv.reader(text.rstrip("\r\n").splitlines() or [""]))
    if len(rows) != 1:
        raise MessageError(f"{len(rows)} lines in one message: each message must be one CSV line")
    if len(rows[0]) != len(columns):
        raise MessageError(f"{len(rows[0])} fields where the header has {len(columns)} "
                           f"({','.join(columns)}): {text[:80]!r}")
    return rows[0]


def json_frame(records: list[dict]) -> pd.DataFrame:
    return pd.DataFrame.from_records(records) if records else pd.DataFrame()


def csv_frame(rows: list[list[str]], columns: Sequence[str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    for name in frame.columns:
        column = frame[name].mask(frame[name] == "")   # an empty field is missing (NaN), as in read_csv
        try:
            frame[name] = pd.to_numeric(column)
        except (ValueError, TypeError):
            frame[name] = column   # not every value is a number: the column stays text
    return frame
