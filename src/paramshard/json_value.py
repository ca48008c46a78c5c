"""The small JSON values trainer 0 hands the others (``Trainer.broadcast``): checked alike on
the trainer that sends one, on server 0 that keeps it, and on the trainers that receive it.

A value is None, a bool, an int that fits in 64 bits (msgpack carries no larger), a finite float
(strict JSON has no NaN or infinity), a str, a list, or a dict with str keys, nested at most
MAX_DEPTH deep, and its compact JSON text is at most MAX_BYTES long. Tuples are refused rather
than turned into lists: every trainer, the chief too, gets back exactly what JSON gives.
"""
from __future__ import annotations

import json
import math

from paramshard.errors import ConfigError

MAX_BYTES = 64 * 1024
MAX_DEPTH = 32
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)     # what msgpack packs


def encoded(value, what: str = "the broadcast value") -> bytes:
    """``value`` as compact UTF-8 JSON, after checking it (ConfigError naming what is wrong)."""
    _check(value, what, "value", 0)
    data = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{what} is {len(data)} bytes as JSON, more than the {MAX_BYTES} allowed: broadcast a "
                          f"small decision (a flag, a number), not data; write large things to a file")
    return data


def decoded(data: bytes, what: str = "the broadcast value"):
    """The value of JSON bytes made by ``encoded`` (checked again: they came from elsewhere)."""
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{what}: {len(data)} bytes, more than the {MAX_BYTES} allowed")
    try:
        value = json.loads(bytes(data).decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{what} is not valid JSON ({exc})") from None
    encoded(value, what)
    return value


def _check(value, what: str, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ConfigError(f"{what}: {where} is nested more than {MAX_DEPTH} deep")
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise ConfigError(f"{what}: {where} = {value} does not fit in 64 bits")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{what}: {where} = {value!r} is not a finite number (JSON has no NaN or inf)")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, what, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{what}: {where} has the key {key!r}: JSON keys are strings")
            _check(item, what, f"{where}[{key!r}]", depth + 1)
        return
    hint = (" (use a list: every trainer gets what JSON gives back)" if isinstance(value, tuple) else
            " (a numpy scalar: use .item())" if callable(getattr(value, "item", None)) else "")
    raise ConfigError(f"{what}: {where} is a {type(value).__name__}{hint}; a broadcast value is JSON: None, "
                      f"bool, int, float, str, list or dict with str keys")
