"""Type checks for a checkpoint's JSON documents (manifest.py, positions.py): each
raises Invalid with a one-line phrase naming the field, which the caller prefixes
with the file and turns into a CheckpointError."""
from __future__ import annotations

import math

MAX_NAME = 1024


class Invalid(Exception):
    """One schema problem, worded to follow "FILE: "."""


def show(value) -> str:
    """A value from the file for a message: one line, short (repr escapes newlines)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(value, what: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise Invalid(f"{what} must be a whole number {bound}, got {show(value)}")
    return value


def lr_scale(value, what: str) -> float:
    """A learning-rate scale (Trainer.scale_learning_rate): a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise Invalid(f"{what} must be a finite number > 0 (a learning-rate scale), got {show(value)}")
    return float(value)


def text(value, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise Invalid(f"{what} must be a non-empty string, got {show(value)}")
    return value


def obj(value, what: str, required=()) -> dict:
    if not isinstance(value, dict):
        raise Invalid(f"{what} must be a JSON object, got {type(value).__name__}")
    missing = [k for k in required if k not in value]
    if missing:
        raise Invalid(f"{what} has no {missing[0]!r}")
    return value


def array(value, what: str) -> list:
    if not isinstance(value, list):
        raise Invalid(f"{what} must be a JSON list, got {type(value).__name__}")
    return value
