"""Which servers a running job has now, for whoever watches it (`paramshard stats`, the
launcher's Monitor): the ones it started with, and any a `paramshard scale --servers` added
since. The job's routing, held by server 0 (``routing_get``), names them: its ``addresses``
are every server the job ever had, by index, "" for one a scale removed (it serves nothing
and exits once no trainer routes to it). A server named for the first time gets a link of its own (one address:
its index there is 0), so the links to the first ones stay as they were.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from paramshard.errors import ParamshardError
from paramshard.placement.partitions import Routing

if TYPE_CHECKING:
    from paramshard.transport.links import ServerLinks


class JobServers:
    """``links``: to the servers the job started with (index = server id); ``connect_one``:
    address -> links to that one server (the same security), for servers added later."""

    def __init__(self, links: ServerLinks, connect_one: Callable[[str], ServerLinks]):
        self.links = links
        self.connect_one = connect_one
        self.added: dict[int, ServerLinks] = {}      # server id -> its own links (index 0)
        self.removed: set[int] = set()           # server ids the routing no longer names

    def refresh(self, timeout: float | None = None, cancel=None) -> None:
        """Read the routing from server 0 and connect the servers it names for the first time.
        Server 0 not answering (busy, restarting, stopping): the list stays as it was.
        ``cancel`` set: stop waiting at once (a watcher told to stop)."""
        try:
            if cancel is None:
                header, _ = self.links.request(0, {"op": "routing_get"}, timeout=timeout)
            else:
                ticket = self.links.submit([(0, {"op": "routing_get"}, ())], timeout=timeout)
                [(header, _)] = self.links.collect(ticket, cancel=cancel)
            routing = Routing.from_wire(header.get("routing"))
        except ParamshardError:
            return
        self.removed = {i for i, address in enumerate(routing.addresses) if not address}
        for i, address in enumerate(routing.addresses):
            if address and i >= len(self.links) and i not in self.added:
                self.added[i] = self.connect_one(address)

    def live(self) -> list[int]:
        """Every server id the job has now (started with, or added and not removed)."""
        return sorted((set(range(len(self.links))) | set(self.added)) - self.removed)

    def link(self, server: int) -> tuple[ServerLinks, int]:
        """(links, index) to ask ``server`` through."""
        return (self.added[server], 0) if server in self.added else (self.links, server)

    def close(self) -> None:
        for links in self.added.values():
            links.close()
        self.added = {}
