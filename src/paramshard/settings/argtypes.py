"""Flag value parsers shared by the commands' generated flags (argparse ``type=``).

Each raises an ArgumentError without an action: argparse then reports the message
alone ("paramshard launch: error: MESSAGE", exit 2), like its own errors.
"""
from __future__ import annotations

import argparse
import math


def flag_error(message: str) -> argparse.ArgumentError:
    return argparse.ArgumentError(None, message)


def positive(flag: str, convert, what: str):
    """`paramshard launch`'s counts and seconds: a whole number >= 1, or finite seconds > 0."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise flag_error(f"{flag} {text}: not {what}") from None
        if convert is int and value < 1:
            raise flag_error(f"{flag} {text}: must be >= 1")
        if convert is float and not (math.isfinite(value) and value > 0):
            raise flag_error(f"{flag} {text}: must be > 0 seconds" if math.isfinite(value) else
                             f"{flag} {text}: must be a finite number > 0 seconds")
        return value
    parse.__name__ = convert.__name__
    return parse


def count(flag: str, minimum: int = 1):
    """`paramshard k8s`'s counts: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise flag_error(f"{flag} {text}: not a whole number") from None
        if value < minimum:
            raise flag_error(f"{flag} {text}: must be >= {minimum}")
        return value
    return parse


def port(flag: str):
    def parse(text: str) -> int:
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise flag_error(f"{flag} {text}: expected a port number 1..65535")
        return int(text)
    return parse


def seconds(flag: str):
    """`paramshard k8s --timeout`: a finite number of seconds > 0."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise flag_error(f"{flag} {text}: not a number of seconds") from None
        if not (math.isfinite(value) and value > 0):
            raise flag_error(f"{flag} {text}: must be a finite number > 0 seconds")
        return value
    return parse


def trainers(text: str) -> "int | tuple[int, int]":
    """`paramshard launch --trainers`: N, or MIN:MAX for an elastic job (MAX slots, at least MIN);
    the command splits the range into PARAMSHARD_TRAINERS and PARAMSHARD_MIN_TRAINERS."""
    low, sep, high = text.partition(":")
    try:
        if not sep:
            return int(text)
        least, most = int(low), int(high)
    except ValueError:
        raise flag_error(f"--trainers {text}: not a whole number, nor MIN:MAX (e.g. 2:4)") from None
    if not 1 <= least <= most:
        raise flag_error(f"--trainers {text}: MIN:MAX needs 1 <= MIN <= MAX")
    return least, most
