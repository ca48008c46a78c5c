"""A serving replica's status file in its delta directory (layout and fields: online/replica_status.py),
rewritten every ``interval`` seconds while it serves and removed when it stops cleanly, so
`paramshard report` shows each replica's freshness and how far behind the servers it is.

A directory the replica cannot write to (a read-only mount) costs only the status: the failure is
logged once and the replica serves on.
"""
from __future__ import annotations

import os
import socket
import threading
import time

from paramshard.log import get_logger
from paramshard.online.replica_status import status_path, write_status

log = get_logger("serve")
INTERVAL = 5.0           # seconds between two writes of the status (`paramshard serve --status-every`)


class StatusWriter:
    def __init__(self, replica, port: int, url: str | None = None, interval: float = INTERVAL,
                 host: str | None = None, clock=time.time):
        self.replica, self.interval, self.clock = replica, interval, clock
        self.host = host or socket.gethostname()
        self.port, self.url = port, url
        self.path = status_path(replica.root, self.host, port)
        self.started = clock()
        self.failed: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def status(self) -> dict:
        """What the replica serves now (online/replica_status.py's fields)."""
        r, now = self.replica, self.clock()
        version = r.version
        newest = r.newest_created
        return {"replica": self.path.stem, "host": self.host, "port": self.port, "pid": os.getpid(), "url": self.url,
                "interval_s": self.interval, "started": self.started, "updated": now,
                "version": version, "step": version.get("step"), "newest_created": newest,
                "freshness_s": None if newest is None else round(max(0.0, now - newest), 3),
                "files_applied": r.files_applied, "rows_applied": r.rows_applied,
                "ok": not r.errors and not r.buffer.broken, "errors": dict(r.errors), "last_error": r.last_error}

    def write(self) -> bool:
        """Write the status now; False (logged once) when the directory refuses it."""
        try:
            write_status(self.path, self.status())
        except OSError as exc:
            why = f"cannot write the replica's status file {self.path} ({exc.strerror or exc}): `paramshard " \
                  f"report` will not show this replica; it serves on"
            if why != self.failed:
                log.warning(why)
            self.failed = why
            return False
        self.failed = None
        return True

    def start(self) -> "StatusWriter":
        self.write()
        self._thread = threading.Thread(target=self._loop, name="serve-status", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def close(self) -> None:
        """Stop writing and remove the file: a replica that stopped cleanly is not listed as gone."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 10)
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning(f"cannot remove the replica's status file {self.path} ({exc.strerror or exc}): it will "
                        f"be shown as a replica gone once it is stale")
