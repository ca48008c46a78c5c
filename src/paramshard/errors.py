"""One error family. Every message says who is at fault and what to do next."""


class ParamshardError(Exception):
    """Base of every error paramshard raises on purpose."""


class ConfigError(ParamshardError, ValueError):
    """Bad user input: flags, environment, shapes, names."""


class ProtocolError(ParamshardError):
    """A message that does not follow the wire protocol."""


class RemoteError(ParamshardError):
    """A server answered a request with an error reply."""

    def __init__(self, server: str, code: str, message: str):
        self.server, self.code, self.remote_message = server, code, message
        super().__init__(f"{server} rejected the request ({code}): {message}")


class ServerUnavailable(ParamshardError):
    """A server did not answer in time or its connection dropped."""


class StaleEpoch(ParamshardError):
    """A request from before a reset (the job rolled back to a checkpoint): refused."""


class AlreadyApplied(ParamshardError):
    """A push a restored server already holds (bounded-loss recovery, server/elastic/replication.py): its
    trainer resent it because the old server died before answering. Error code ``applied``."""
    wire_code = "applied"


class Moved(ParamshardError):
    """A request for ids whose partition this server no longer owns (server/elastic/migration_service.py):
    refused whole, before anything was applied; the client fetches the routing and resends."""
    wire_code = "moved"


class DeadlineExceeded(ParamshardError, TimeoutError):
    """A wait ran past its deadline (the message names what it waited for)."""


class Cancelled(ParamshardError):
    """A wait was called off by its owner (an observer told to stop) before its replies came."""


class LimitExceeded(ConfigError):
    """A request passed one of the server's resource limits (paramshard.limits)."""


class OutOfAddressSpace(LimitExceeded, MemoryError):
    """Rows that would pass the server's address-space limit (RLIMIT_AS, ``ulimit -v``):
    refused before anything changed (server/storage/kernels/arena.py)."""

    def __init__(self, what: str, rows: int, nbytes: int, limit: int | None, used: int, headroom: int,
                 reason: str = "", unit: str = "rows"):
        from paramshard.budgets import show_bytes
        self.what, self.rows, self.nbytes, self.limit = what, rows, nbytes, limit
        limit_text = "no limit" if limit is None else f"the {show_bytes(limit)} limit"
        because = f" ({reason})" if reason else ""
        super().__init__(
            f"{what}: {rows} {unit} need {show_bytes(nbytes)} more address space, which does not fit: the "
            f"process maps {show_bytes(used)} of {limit_text} on its address space (RLIMIT_AS, ulimit -v; "
            f"{show_bytes(headroom)} of it kept for threads and buffers){because}. Reserve fewer rows, "
            f"spread the table over more servers, or raise the servers' address-space limit")
