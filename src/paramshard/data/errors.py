"""The data package's one error: a line of an input file that cannot be read."""
from __future__ import annotations

from ..errors import ParamshardError


class DataFormatError(ParamshardError, ValueError):
    """A malformed input line. The message is ``path:line: reason`` (line is 1-based)
    so an editor or ``sed -n LINEp`` jumps straight to it."""

    def __init__(self, path, line: int, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        self.short = f"{self.path}:{line}: {reason}"
        super().__init__(f"{self.short} (fix or remove the line, or read with skip_bad_lines=True)")


def show(value: bytes, limit: int = 40) -> str:
    """A raw field as it would appear in an error message: quoted, never huge."""
    text = value.decode("utf-8", "replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")
