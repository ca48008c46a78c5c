"""Which connection each trainer talks over, to notice a trainer that dies: its TCP
connection drops and the socket's monitor reports that connection's descriptor.

Pure bookkeeping over (event, descriptor) pairs, so it is tested without sockets;
the server loop feeds it the monitor's events (parameter_server.py).
"""
from __future__ import annotations

import zmq


def peer_address(frame) -> str | None:
    """The IP address a message came from (libzmq's Peer-Address property)."""
    try:
        return frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):
        return None


class TrainerConnections:
    def __init__(self):
        self._trainer_by_fd: dict[int, int] = {}
        # Connections reported closed whose descriptor was not reused since: a message
        # still queued from one of them is not a trainer coming back (the disconnect
        # event can overtake the last messages the connection delivered).
        self._closed_fds: set[int] = set()

    def tie(self, fd: int, trainer: int) -> bool:
        """An accepted request of ``trainer`` came over connection ``fd``: False (nothing tied)
        when that connection was already reported closed."""
        if fd in self._closed_fds:
            return False
        self._trainer_by_fd[fd] = trainer
        return True

    def event(self, kind: int, fd: int) -> int | None:
        """A monitor event (zmq.EVENT_ACCEPTED or EVENT_DISCONNECTED) for descriptor ``fd``:
        the trainer whose connection just closed, if any."""
        if kind == zmq.EVENT_ACCEPTED:
            self._closed_fds.discard(fd)     # the descriptor now belongs to a new connection
            return None
        self._closed_fds.add(fd)
        return self._trainer_by_fd.pop(fd, None)
