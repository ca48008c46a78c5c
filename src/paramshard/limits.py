"""Resource limits a server enforces before it allocates anything.

A 100-byte request must never cost a server gigabytes: every limit is checked
on the request's header (or libzmq drops an oversized message before it is
buffered, ``ZMQ_MAXMSGSIZE``), and an exceeded limit is an error naming the
limit and the variable that raises it. Defaults fit a large CTR job on one
machine; raise them for bigger jobs.
"""
from __future__ import annotations

import dataclasses

from .errors import ConfigError, LimitExceeded

# field -> (environment variable, default, what it bounds)
SPEC = {
    "max_message_bytes": ("PARAMSHARD_MAX_MESSAGE_BYTES", 1 << 30,
                          "largest message a server accepts, in bytes (libzmq drops bigger ones unread)"),
    "max_ids": ("PARAMSHARD_MAX_IDS", 1 << 24, "ids in one sparse pull or push"),
    "max_rows": ("PARAMSHARD_MAX_ROWS", 1 << 30, "rows of one sparse table on one server"),
    "max_dim": ("PARAMSHARD_MAX_DIM", 4096, "columns of a sparse table row"),
    # 100 clients that never read cost at most ~100 x (this + one reply): 13 GB with a 4 MB model.
    "max_queued_bytes": ("PARAMSHARD_MAX_QUEUED_BYTES", 128 << 20,
                         "bytes of replies one connection may leave unread on a server; its next requests "
                         "wait for them to drain and are refused after PARAMSHARD_TIMEOUT"),
}


@dataclasses.dataclass(frozen=True)
class Limits:
    max_message_bytes: int = SPEC["max_message_bytes"][1]
    max_ids: int = SPEC["max_ids"][1]
    max_rows: int = SPEC["max_rows"][1]
    max_dim: int = SPEC["max_dim"][1]
    max_queued_bytes: int = SPEC["max_queued_bytes"][1]

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{SPEC[field.name][0]}={value!r}: must be a whole number >= 1")
        if self.max_rows > (1 << 31) - 1:
            # Row numbers are int32 in the id index.
            raise ConfigError(f"PARAMSHARD_MAX_ROWS={self.max_rows}: at most {(1 << 31) - 1} rows per table "
                              f"per server; spread a bigger table over more servers")

    def check(self, field: str, value: int, what: str) -> None:
        """Raise LimitExceeded when ``value`` passes the limit ``field``."""
        limit = getattr(self, field)
        if value > limit:
            variable, _, meaning = SPEC[field]
            raise LimitExceeded(f"{what}: {value} is over the limit of {limit} ({meaning}); "
                                f"raise it with {variable} on every process if this is intended")

    def to_environ(self) -> dict[str, str]:
        return {SPEC[f.name][0]: str(getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}
