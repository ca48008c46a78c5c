"""The data package's one error: an input file, or a line of one, that cannot be read."""
from __future__ import annotations

from paramshard.errors import ParamshardError

LINE_HINT = "fix or remove the line, or read with skip_bad_lines=True"


class DataFormatError(ParamshardError, ValueError):
    """A malformed input line or file. The message is ``path:line: reason`` (line is
    1-based) so an editor or ``sed -n LINEp`` jumps straight to it, or ``path: reason``
    when the whole file is at fault (``line`` is then None)."""

    def __init__(self, path, line: int | None, reason: str, hint: str | None = LINE_HINT):
        self.path, self.line, self.reason = str(path), line, reason
        self.short = f"{self.path}:{line}: {reason}" if line is not None else f"{self.path}: {reason}"
        super().__init__(f"{self.short} ({hint})" if hint else self.short)


def show(value: bytes, limit: int = 40) -> str:
    """A raw field as it would appear in an error message: quoted, never huge."""
    text = value.decode("utf-8", "replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")
