"""What ``paramshard scale RUN_DIR --remove-host HOST`` takes off a running SSH job, or why it refuses.

Pure: given where the job's serving servers and staying trainers run, ``plan_removal`` says which
servers give their partitions and dense blocks away (exactly those on the host, whatever their
index), which trainer slots leave at their step boundary, and what the job keeps; or raises
ConfigError saying why not, before anything moves. The launcher (Launcher._remove_host, for a job
whose Placement is on hosts: SSH) then starts the move (ElasticServers.remove), asks the trainers to
leave (ElasticTrainers.ask_to_leave) and drops the host from the placement (SshPlacement.remove_host),
so later scales never place a rank there. The trainer count goes down by the host's trainers: no
replacement starts elsewhere (``scale --trainers N`` afterwards starts them on the remaining hosts).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from paramshard.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class HostRemoval:
    host: str
    servers: list[int]            # serving servers on the host: their partitions and blocks move away
    servers_after: list[int]      # the servers that serve once the move ended
    trainers: list[int]           # trainer slots on the host, asked to leave at their step boundary
    trainers_after: int           # trainers running (and not leaving) once they left


def plan_removal(host: str, servers_on: Mapping[int, str], trainers_on: Mapping[int, str], *,
                 partitions: int, min_trainers: int | None, max_trainers: int, moving: bool) -> HostRemoval:
    """``host``: one of the job's hosts (its name, as ``servers_on``/``trainers_on`` give it);
    ``servers_on``: each serving server (not retired) -> its host; ``trainers_on``: each trainer slot
    running and not asked to leave -> its host; ``partitions``: the job's (0: fixed hash);
    ``min_trainers``: the elastic floor (None: not elastic); ``moving``: a move of partitions is
    under way. ConfigError names the first reason it cannot be done and what to do instead."""
    asked = f"--remove-host {host}"
    servers = sorted(s for s, h in servers_on.items() if h == host)
    trainers = sorted(t for t, h in trainers_on.items() if h == host)
    if 0 in servers:
        raise ConfigError(f"{asked}: it runs server 0, which holds the job's routing (which server owns each "
                          f"partition and block) and its services (shard queue, barriers); it cannot leave a "
                          f"running job. Remove another host, or launch the job again with server 0 elsewhere "
                          f"(it runs on the first host of --server-hosts, else of --hosts)")
    if 0 in trainers:
        raise ConfigError(f"{asked}: it runs trainer 0, the chief (it writes the checkpoints and the job's "
                          f"decisions), which does not leave a running job. Remove another host, or launch the "
                          f"job again so that trainer 0 runs elsewhere (--trainer-hosts)")
    if servers and not partitions:
        raise ConfigError(f"{asked}: it runs servers {servers} and this job routes sparse ids by a fixed hash, so "
                          f"they cannot hand their rows over; launch it with --partitions P (e.g. 1024) to remove "
                          f"servers while it runs")
    if trainers and min_trainers is None:
        raise ConfigError(f"{asked}: it runs trainers {trainers} and this job is not elastic; launch it with "
                          f"--trainers MIN:MAX to let trainers leave while it runs")
    staying = [s for s in servers_on if s not in servers]
    if not staying:
        raise ConfigError(f"{asked}: it runs every serving server ({servers}); the job would have none left. Add "
                          f"servers elsewhere first (--servers N --on HOST)")
    left = len(trainers_on) - len(trainers)
    if trainers and min_trainers is not None and left < min_trainers:     # not None: checked above
        raise ConfigError(f"{asked}: its trainers {trainers} leaving would leave {left}, fewer than the job's "
                          f"minimum {min_trainers} (--trainers {min_trainers}:{max_trainers}); start trainers on "
                          f"other hosts first (--trainers N)")
    if moving:      # it may be placing a new server on this very host, or moving to one there
        raise ConfigError(f"{asked}: a move of partitions is under way; ask again when it ended (a scale_end "
                          f"event in the run directory)")
    return HostRemoval(host, servers, sorted(staying), trainers, left)
