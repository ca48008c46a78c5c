"""Client side of the control requests (server side: server/core/control_handlers.py,
server/services/trainer_barrier.py): for trainers, and for whoever else asks the servers
(the launcher's watcher, `paramshard stats`), which call these instead of
building requests themselves.
"""
from __future__ import annotations

import threading
import time

from paramshard import json_value
from paramshard.errors import ConfigError, DeadlineExceeded, ParamshardError, ProtocolError, RemoteError
from paramshard.client.recovery import install
from paramshard.transport.links import ServerLinks
from paramshard.messages.server_stats import ServerStats

# A barrier waits for the slowest trainer (its epoch, the chief's evaluation), which may take
# far longer than one request: by default it waits this many PARAMSHARD_TIMEOUTs. A dead
# trainer fails it at once anyway; the limit is for a live one that never comes (a script
# that calls barrier() a different number of times on different trainers).
BARRIER_TIMEOUT_FACTOR = 10


def connect(env, who: str, timeout: float | None = None) -> ServerLinks:
    """Links to the servers of ``env`` (its addresses and security), for a watcher or a tool
    (a trainer's env: with its recovery's retry policy)."""
    links = ServerLinks.for_job(env, who=who, timeout=timeout)
    install(links, env)
    return links


def wait_for_servers(env, who: str, timeout: float = 30.0) -> None:
    """Block until every server of ``env`` answers ``hello``; raise naming those that do not."""
    with connect(env, who, timeout=timeout) as links:
        links.wait_ready(timeout)


def read_stats(links: ServerLinks, server: int, timeout: float | None = None,
               cancel: threading.Event | None = None) -> ServerStats:
    """Server ``server``'s counters and tables, parsed (ProtocolError if malformed). ``cancel``
    set: stop waiting at once (errors.Cancelled), e.g. a watcher told to stop."""
    ticket = links.submit([(server, {"op": "stats"}, ())], timeout=timeout)
    # In-process links (server/core/in_process.py) answer before collect: they take no cancel.
    [(header, _)] = links.collect(ticket, cancel=cancel) if cancel is not None else links.collect(ticket)
    return _parse(header)


def server_stats(links: ServerLinks) -> list[dict]:
    """Every server's ``stats`` reply by server index, checked (ServerStats.from_wire), in its
    wire form: what ``Trainer.server_stats()`` gives a script (plain dicts, JSON-ready)."""
    replies = links.request_many({s: ({"op": "stats"}, ()) for s in links.live()})
    return [_parse(replies[s][0]).to_wire() for s in sorted(replies)]


def _parse(header: dict) -> ServerStats:
    if "stats" not in header:
        raise ProtocolError("stats reply without a 'stats' field")
    return ServerStats.from_wire(header["stats"])


def leave(links: ServerLinks, trainer_id: int, timeout: float | None = None) -> None:
    """Tell every server this trainer is done: sync barriers stop waiting for it. A server a scale
    removed (retired in ``links``, which follow the routing) is not asked: it may have exited."""
    links.request_many({s: ({"op": "leave", "trainer": trainer_id}, ()) for s in links.live()},
                       timeout=timeout)


def join(links: ServerLinks, trainer_id: int, timeout: float, clock=time.monotonic,
         barrier_counts: dict | None = None) -> int:
    """Take slot ``trainer_id`` of a running elastic job (server/control_handlers.handle_join);
    returns the first step this trainer pushes. Every server is asked for the steps it
    completed (the index of its step in progress), and the trainer joins from the step after
    the highest: the step in progress completes without it. A server whose step in progress
    moved past that meanwhile answers ``joined`` false, and the trainer asks again (each
    server keeps the newest first step), until every server took it or ``timeout`` passed.
    ``barrier_counts``: filled with server 0's count of each barrier and broadcast name, where
    this trainer's go on from (server/services/trainer_barrier.py). Servers a scale removed are not asked
    (``links`` follow the job's routing first)."""
    deadline = clock() + timeout
    everyone = links.live()
    while True:
        probes = links.request_many({s: ({"op": "join", "trainer": trainer_id}, ()) for s in everyone},
                                    timeout=timeout)
        first = max(header["version"] for header, _ in probes.values()) + 1
        replies = links.request_many({s: ({"op": "join", "trainer": trainer_id, "first_step": first}, ())
                                      for s in everyone}, timeout=timeout)
        if all(header.get("joined") for header, _ in replies.values()):
            if barrier_counts is not None:
                barrier_counts.clear()
                barrier_counts.update(_counts_of(replies[0][0], trainer_id))
            return first
        if clock() >= deadline:
            late = sorted(s for s, (header, _) in replies.items() if not header.get("joined"))
            raise DeadlineExceeded(f"trainer {trainer_id} could not join within {timeout:g} s: servers {late} "
                                   f"completed each step before it could join it (steps shorter than a round "
                                   f"trip?)")


def _counts_of(header: dict, trainer_id: int) -> dict[str, int]:
    """Server 0's ``barrier_counts`` of a join reply, checked."""
    counts = header.get("barrier_counts", {})
    if not isinstance(counts, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0
                                               for k, v in counts.items()):
        raise ProtocolError(f"trainer {trainer_id}: server 0's join reply has malformed barrier_counts {counts!r}")
    return dict(counts)


NO_VALUE = object()      # barrier(): a plain barrier, not a broadcast


def barrier(links: ServerLinks, trainer_id: int, name: str, count: int, timeout: float | None = None,
            epoch: int | None = None, resumed: bool = False, broadcast: bool = False, value=NO_VALUE):
    """Enter barrier ``name`` for the ``count``-th time and return once every trainer that has
    not left entered it as often. Server 0 decides. ``timeout``: seconds in all (None:
    BARRIER_TIMEOUT_FACTOR x the links' timeout; math.inf: as long as the trainers waited for
    are alive). Raises naming the missing trainers: at once if one of them lost its
    connection, else at the deadline.

    ``broadcast``: a broadcast's entry; trainer 0's carries ``value`` (a small JSON value,
    json_value.py) and every trainer gets it back (returned); a plain barrier returns None."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"barrier name must be a non-empty str, got {name!r}")
    if timeout is None:
        timeout = BARRIER_TIMEOUT_FACTOR * links.timeout
    if not timeout > 0:
        raise ConfigError(f"barrier timeout must be > 0 seconds (math.inf: no limit), got {timeout!r}")
    header = {"op": "barrier", "trainer": trainer_id, "name": name, "count": count}
    if epoch is not None:       # a server of another epoch (restarted, rolled back) refuses it: "reset"
        header["epoch"] = epoch
    if resumed:                 # the count comes from a checkpoint (server/services/trainer_barrier.py)
        header["resumed"] = True
    if broadcast:
        header["broadcast"] = True
        if value is not NO_VALUE:
            json_value.encoded(value)       # a ConfigError here rather than an error reply
            header["value"] = value
    deadline = time.monotonic() + timeout
    while True:
        # Server 0 answers a waiting request within PARAMSHARD_TIMEOUT (the links' timeout),
        # with a ``timeout`` error if the barrier is not complete by then: ask again (the same
        # count is a retry) until our own deadline.
        wait = min(links.timeout, deadline - time.monotonic())
        try:
            reply, _ = links.request(0, header, timeout=wait)
            return _value_of(reply, name, count) if broadcast else None
        except RemoteError as exc:
            if exc.code != "timeout":
                raise
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(f"trainer {trainer_id}: barrier {name!r} #{count} did not complete "
                                       f"within {timeout:g} s: {exc.remote_message}") from None
        except DeadlineExceeded:
            if time.monotonic() < deadline:
                raise           # not ours (an in-process server that can never complete it)
            # Our deadline came before the server's: ask it who is missing.
            raise DeadlineExceeded(f"trainer {trainer_id}: barrier {name!r} #{count} did not complete within "
                                   f"{timeout:g} s: {_missing(links, name)}") from None


def _value_of(reply: dict, name: str, count: int):
    if "value" not in reply:
        raise ProtocolError(f"server 0's reply to broadcast {name!r} #{count} carries no value")
    value = reply["value"]
    json_value.encoded(value, f"server 0's value of broadcast {name!r} #{count}")    # it came from elsewhere
    return value


def scale_learning_rate(links: ServerLinks, trainer_id: int, factor: float, dense: bool, tables: list[str],
                        min_version: int | None, epoch: int | None = None) -> list[dict]:
    """Trainer 0: every server multiplies the learning rate of its dense blocks (``dense``) and
    of ``tables`` by ``factor`` (server/services/learning_rates.py), once it completed ``min_version``
    steps (sync; None: at once). Returns each server's reply: the scales it now applies."""
    header = {"op": "scale_lr", "factor": float(factor), "dense": dense, "tables": list(tables),
              "trainer": trainer_id}
    if min_version is not None:
        header["min_version"] = min_version
    if epoch is not None:       # sent before a rollback: refused after it ("reset")
        header["epoch"] = epoch
    replies = links.request_many({s: (header, ()) for s in links.live()})
    return [replies[s][0] for s in sorted(replies)]


def _missing(links: ServerLinks, name: str) -> str:
    try:
        barriers = read_stats(links, 0, timeout=min(5.0, links.timeout)).barriers
    except ParamshardError as exc:
        return f"server 0 could not say who is missing ({exc})"
    if barriers is None:
        return "server 0 could not say who is missing (its stats have no barriers)"
    wait = barriers.waiting.get(name)
    if wait is None:
        return "server 0 has no trainer waiting in it any more (it completed just now, or the job rolled back)"
    return f"trainers {list(wait.missing)} have not entered it yet (server 0 waits in #{wait.count})"
