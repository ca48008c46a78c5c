"""Resource limits a server enforces before it allocates anything.

A 100-byte request must never cost a server gigabytes: every limit is checked
on the request's header (or libzmq drops an oversized message before it is
buffered, ``ZMQ_MAXMSGSIZE``), and an exceeded limit is an error naming the
limit and the variable that raises it. Defaults fit a large CTR job on one
machine; raise them for bigger jobs.
"""
from __future__ import annotations

import dataclasses

from paramshard.errors import ConfigError, LimitExceeded

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
    # One budget per server, whatever the number of connections (server/core/memory_budget.py).
    "max_server_bytes": ("PARAMSHARD_MAX_SERVER_BYTES", 0,
                         "bytes one server may hold in all for its connections: replies queued, requests received "
                         "and not yet handled, partition pages staged by a move; beyond it requests are refused "
                         "as busy and clients retry until their deadline (0: 4 x PARAMSHARD_MAX_MESSAGE_BYTES)"),
}

# The server-wide budget when PARAMSHARD_MAX_SERVER_BYTES is 0: room for a few of the largest
# messages at once (one being handled, one reply queued, one staged page) and then some.
SERVER_BYTES_PER_MESSAGE = 4


@dataclasses.dataclass(frozen=True)
class Limits:
    max_message_bytes: int = SPEC["max_message_bytes"][1]
    max_ids: int = SPEC["max_ids"][1]
    max_rows: int = SPEC["max_rows"][1]
    max_dim: int = SPEC["max_dim"][1]
    max_queued_bytes: int = SPEC["max_queued_bytes"][1]
    max_server_bytes: int = SPEC["max_server_bytes"][1]

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            least = 0 if field.name == "max_server_bytes" else 1      # 0: derived (server_bytes)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{SPEC[field.name][0]}={value!r}: must be a whole number >= {least}")
        if self.max_server_bytes and self.max_server_bytes < 2 * self.max_message_bytes:
            # Any message must fit in the half of the budget a move's staged pages leave free.
            raise ConfigError(f"PARAMSHARD_MAX_SERVER_BYTES={self.max_server_bytes}: at least twice "
                              f"PARAMSHARD_MAX_MESSAGE_BYTES ({self.max_message_bytes}), or 0 for "
                              f"{SERVER_BYTES_PER_MESSAGE} x it")
        if self.max_rows > (1 << 31) - 1:
            # Row numbers are int32 in the id index.
            raise ConfigError(f"PARAMSHARD_MAX_ROWS={self.max_rows}: at most {(1 << 31) - 1} rows per table "
                              f"per server; spread a bigger table over more servers")

    @property
    def server_bytes(self) -> int:
        """The server-wide memory budget in force (PARAMSHARD_MAX_SERVER_BYTES, or its default)."""
        return self.max_server_bytes or SERVER_BYTES_PER_MESSAGE * self.max_message_bytes

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
