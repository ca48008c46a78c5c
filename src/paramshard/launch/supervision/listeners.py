"""Who is told what happens to a running job: handed to the Launcher when it is built.

``paramshard launch`` hands in observe/live/job_watch.py's (the run directory's events);
tests hand in lists. Nobody adds one to a Launcher that exists: what a run tells is fixed
when it is built (launch/supervision/build.py).
"""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class JobListeners:
    # Each in-place restart as (rank name, why).
    restarted: tuple[Callable[[str, str], None], ...] = ()
    # An elastic job's trainers and servers changing, as (change, text, **fields)
    # (launch/elastic/elastic_trainers.py, elastic_servers.py).
    membership: tuple[Callable[..., None], ...] = ()
    # Other events as (event, text, **fields): the replica keeper's, a move's, a host added or removed.
    events: tuple[Callable[..., None], ...] = ()

    def restart(self, rank: str, why: str) -> None:
        for listener in self.restarted:
            listener(rank, why)

    def member(self, change: str, text: str, **fields) -> None:
        for listener in self.membership:
            listener(change, text, **fields)

    def event(self, event: str, text: str, **fields) -> None:
        for listener in self.events:
            listener(event, text, **fields)
