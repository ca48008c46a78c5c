"""Trainer side of the control requests (server side: ParameterServer.handle_stats/leave)."""
from __future__ import annotations

from ..transport.client import ServerLinks


def server_stats(links: ServerLinks) -> list[dict]:
    """Every server's counters and tables (ParameterServer.snapshot_stats), by server index."""
    replies = links.request_many({s: ({"op": "stats"}, ()) for s in range(len(links))})
    return [replies[s][0]["stats"] for s in sorted(replies)]


def leave(links: ServerLinks, trainer_id: int, timeout: float | None = None) -> None:
    """Tell every server this trainer is done: sync barriers stop waiting for it."""
    links.request_many({s: ({"op": "leave", "trainer": trainer_id}, ()) for s in range(len(links))},
                       timeout=timeout)
