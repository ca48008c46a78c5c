"""Status lines: what a supervised server tells its launcher, typed, on its own stdout.

Under ``paramshard launch`` (``PARAMSHARD_RECORDS=stdout``: the launcher reads every
rank's stdout and takes marked lines out) a server with peers writes one line

    \\x1eparamshard-status {"server": 0, "unreachable": {"1": 5.2}, "gone": [], "unseen": []}

every ``STATUS_EVERY`` seconds and at once when the set of unreachable or unseen
peers changes: which peer servers it has lost the heartbeat of, for how many
seconds, which it has not reached yet, and, in its last line before exiting with
``PEER_LOST_EXIT_CODE``, the peers it exits for; when it stops watching its peers (it exits,
for whatever reason) it says so in one last line (``"stopping": true``), so that a server
slow to exit at the end of its job is not taken for a hung one. The launcher needs no text matching to learn who named whom, and the
lines double as the server's own heartbeat to the launcher: a hung server (SIGSTOP,
a frozen VM) stops writing them, a partitioned one does not (launch/supervision/peer_loss.py).
The channel is the launcher's own pipe, so it works the same over SSH.

Standard library only: the server imports it, and so does the launcher's child pump.
"""
from __future__ import annotations

import dataclasses
import json

STATUS_MARK = "\x1eparamshard-status "
STATUS_EVERY = 1.0           # seconds between two status lines of a server with peers
# A server's exit code when it stopped because a peer server stayed unreachable for
# PARAMSHARD_TIMEOUT (EX_UNAVAILABLE): it failed because another one did.
PEER_LOST_EXIT_CODE = 69


@dataclasses.dataclass(frozen=True)
class PeerStatus:
    server: int                                   # who writes it
    unreachable: dict[int, float] = dataclasses.field(default_factory=dict)   # peer -> seconds without heartbeat
    gone: tuple[int, ...] = ()                    # peers it exits for
    # Peers it never completed a handshake with (still starting, or hung before it
    # answered anyone): a peer can be named unreachable only once it was reached.
    unseen: tuple[int, ...] = ()
    # Its last line: it stopped watching its peers and exits (the end of its job, or a lost peer).
    # Its silence from then on is its exit, however long that takes, never a hang.
    stopping: bool = False

    def line(self) -> str:
        body = {"server": self.server, "unreachable": {str(k): round(v, 2) for k, v in sorted(self.unreachable.items())},
                "gone": list(self.gone), "unseen": list(self.unseen), **({"stopping": True} if self.stopping else {})}
        return STATUS_MARK + json.dumps(body, separators=(",", ":")) + "\n"

    @classmethod
    def parse(cls, line: str) -> "PeerStatus | None":
        """The status in a line (with or without its newline), None for any other line
        or a malformed one (a server of another version, a torn write)."""
        if not line.startswith(STATUS_MARK):
            return None
        try:
            body = json.loads(line[len(STATUS_MARK):])
            return cls(int(body["server"]), {int(k): float(v) for k, v in body.get("unreachable", {}).items()},
                       tuple(int(i) for i in body.get("gone", ())), tuple(int(i) for i in body.get("unseen", ())),
                       body.get("stopping") is True)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
