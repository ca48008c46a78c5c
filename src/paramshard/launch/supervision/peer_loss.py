"""Which servers a launcher restarts when servers lose each other: pure logic, no processes.

A server names the peer servers it lost the heartbeat of in its status lines
(messages/status_lines.py) and exits with ``PEER_LOST_EXIT_CODE`` when one stays
unreachable for ``PARAMSHARD_TIMEOUT``. Named is not guilty: the named server
may be hung (SIGSTOP, a frozen VM: alive, port open, answering nothing), dead,
or cut off from the one naming it by the network. The status lines are also
each server's heartbeat to the launcher, over the launcher's own pipe, so:

- named, alive, and silent to the launcher too (no status line for
  ``SILENT_AFTER`` s): **hung**. The launcher SIGKILLs it and restarts it in place;
  unless its last line said it is stopping: a server exiting at the end of its job (its
  peers name it as soon as it closes its sockets) may take seconds to exit, silent;
- named, alive, still writing status lines: not hung. If it names its accuser
  back, the two are **partitioned** from each other; nobody is killed (killing
  both blindly would lose two servers for a network fault, and killing one is a
  guess), and the servers' own timeout ends the job if the fault lasts. This
  verdict (a warning, no action) waits until the accusation has stood
  ``SILENT_AFTER`` s: each server's lines come over its own pipe, in no order with
  another's, so the accusation of a server that stopped at the end of its job (it says
  so, then closes its socket, and only then can a peer name it) may be read before
  the accused's own last line; by ``SILENT_AFTER`` s on, a stopping server has said
  so or exited, and one still reporting has reported since it was named;
- exited with ``PEER_LOST_EXIT_CODE`` naming only peers that are hung, dead or
  were just restarted: a **casualty**, restarted with them, free of charge;
- exited any other way (or for a peer that is fine): **dead**, restarted, one
  restart each.

One incident costs one restart per root cause (hung or dead server), however
many servers exited because of it.
"""
from __future__ import annotations

import dataclasses
from typing import Collection, Mapping, Sequence

from paramshard.messages.status_lines import PEER_LOST_EXIT_CODE, STATUS_EVERY

# Seconds without a status line after which a server that a peer names is hung.
# Status lines come every STATUS_EVERY s from the server's own loop; a peer names a
# server only after ZeroMQ heartbeats went unanswered for 5 s, which libzmq's I/O
# thread answers even while the loop is busy: both together mean the whole process
# is stopped (or cut off from everyone).
SILENT_AFTER = 3 * STATUS_EVERY


@dataclasses.dataclass(frozen=True)
class ServerState:
    """What the launcher knows about one server at one moment."""
    index: int
    code: int | None = None                              # exit code; None while it runs
    names: Mapping[int, float] = dataclasses.field(default_factory=dict)   # peers it lost -> seconds unreachable
    gone: tuple[int, ...] = ()                           # peers it exited for (its last status line)
    silent_for: float | None = None                      # seconds since its last status line; None: none yet
    stopping: bool = False                               # its last status line said it exits (messages/status_lines.py)

    @property
    def alive(self) -> bool:
        return self.code is None

    @property
    def lost_a_peer(self) -> bool:
        return self.code == PEER_LOST_EXIT_CODE

    def accuses(self) -> set[int]:
        """The peers this server holds unreachable: a running one's, or a peer-lost exit's."""
        if self.alive or self.lost_a_peer:
            return (set(self.names) | set(self.gone)) - {self.index}
        return set()


@dataclasses.dataclass(frozen=True)
class Verdict:
    hung: Mapping[int, str] = dataclasses.field(default_factory=dict)    # SIGKILL, then restart: index -> why
    casualties: tuple[int, ...] = ()     # exited only because of a hung, dead or just-restarted peer
    dead: tuple[int, ...] = ()           # exited on their own (or for a peer that is fine)
    partitions: tuple[tuple[int, int], ...] = ()   # named each other, both alive and reporting
    spared: Mapping[int, str] = dataclasses.field(default_factory=dict)  # named but alive and reporting: why not killed

    @property
    def restart(self) -> tuple[int, ...]:
        """Every server to start again, in index order."""
        return tuple(sorted({*self.hung, *self.casualties, *self.dead}))

    @property
    def cost(self) -> int:
        """Restarts this incident spends: one per root cause."""
        return len(self.hung) + len(self.dead)


def named_for(accuser: ServerState, peer: int) -> float:
    """Seconds since ``accuser`` lost ``peer``, as far as the launcher knows: what its last status
    line said, plus that line's age; a peer it exited for without a count, for ever."""
    seconds = accuser.names.get(peer)
    if seconds is None:
        return float("inf")
    return seconds + (accuser.silent_for or 0.0)


def decide(servers: Sequence[ServerState], just_restarted: Collection[int] = ()) -> Verdict:
    """The verdict for the servers as they are now. ``just_restarted``: servers the
    launcher restarted recently, whose loss a peer may still be exiting for."""
    by_index = {s.index: s for s in servers}
    accusers: dict[int, list[int]] = {}
    for s in servers:
        for peer in sorted(s.accuses()):
            if peer in by_index:
                accusers.setdefault(peer, []).append(s.index)
    hung: dict[int, str] = {}
    spared: dict[int, str] = {}
    partitions: set[tuple[int, int]] = set()
    for index, by in sorted(accusers.items()):
        s = by_index[index]
        if not s.alive:
            continue                                       # dead: counted below
        if s.stopping:
            # It said it exits (the end of its job: a peer that stopped first, or still stopping,
            # names it): its silence is its exit, however slow, not a hang; nothing worth a warning.
            continue
        if s.silent_for is not None and s.silent_for >= SILENT_AFTER:
            lost = " and ".join(f"server {a}" for a in by)
            hung[index] = f"hung: {lost} lost its heartbeat, and it has said nothing to the launcher for {s.silent_for:.1f} s"
            continue
        if max(named_for(by_index[a], index) for a in by) < SILENT_AFTER:
            # Named too recently to tell "still reporting" from "its last line, saying it stops, is
            # still in its pipe" (the module's docstring): judged on a later look.
            continue
        mutual = [a for a in by if index in by_index[a].accuses() and a in s.accuses() and by_index[a].alive]
        partitions.update((min(index, a), max(index, a)) for a in mutual)
        what = "a partition between them?" if mutual else "it still reports to the launcher"
        spared[index] = (f"named unreachable by {', '.join(f'server {a}' for a in by)} but alive and "
                         f"reporting ({what}): not killed"
                         if s.silent_for is not None else
                         f"named unreachable by {', '.join(f'server {a}' for a in by)} before its first "
                         f"status line (starting?): not killed")
    failed = [s for s in servers if not s.alive and s.code != 0]
    named = {s.index: set(s.gone) or set(s.names) for s in failed}
    # Root causes: the hung, the just restarted, and those that failed not for a named peer.
    roots = {*hung, *just_restarted, *(s.index for s in failed if not (s.lost_a_peer and named[s.index]))}
    down = roots | {s.index for s in failed}
    casualties, dead = [], []
    for s in failed:
        peers = named[s.index] - {s.index}
        # Some root cause among the peers it named: two servers that only named each other are
        # not each other's excuse.
        if s.lost_a_peer and peers and peers <= down and peers & roots:
            casualties.append(s.index)
        else:
            dead.append(s.index)
    return Verdict(hung, tuple(casualties), tuple(dead), tuple(sorted(partitions)), spared)

