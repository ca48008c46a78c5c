"""Client side of the data-shard service (server/elastic/shard_service.py, on server 0): the
requests of paramshard.data.DynamicShards, and the queue's snapshot and restore for a
checkpoint (client/checkpoint.py)."""
from __future__ import annotations

from typing import NamedTuple

import secrets

from paramshard.messages.shard_tasks import Task
from paramshard.errors import ConfigError, ProtocolError
from paramshard.mode import Mode
from paramshard.transport.requests import Requests

SERVER = 0
# This process, as the queue knows it: a replacement process in the same trainer slot registers
# with another, and the tasks the dead one held go back to the queue at once.
SESSION = secrets.token_hex(8)


def register(links: Requests, trainer: int, pass_: int, fingerprint: str, files: list[str],
             tasks: list[Task], step: int) -> str:
    """``step``: where the trainer is (sync mode does not wait for its reports of earlier steps)."""
    header, _ = links.request(SERVER, {"op": "shard_register", "trainer": trainer, "pass": pass_,
                                       "fingerprint": fingerprint, "files": files, "step": step, "session": SESSION,
                                       "tasks": [t.to_wire() for t in tasks], "epoch": links.epoch})
    return header.get("registered", "")


def next_task(links: Requests, trainer: int, pass_: int,
              step: int | None) -> tuple[str, Task | Waiting | None, int | None]:
    """("task", the task from its committed position, its lease) / ("finished", None, None) /
    ("wait", Waiting, None). The lease goes back with the task's reports (server/elastic/shard_queue.py)."""
    request = {"op": "shard_next", "trainer": trainer, "pass": pass_, "epoch": links.epoch}
    if step is not None:
        request["step"] = step
    header, _ = links.request(SERVER, request)
    verdict = header.get("verdict")
    if verdict == "task":
        wire = header.get("task")
        if not (isinstance(wire, list) and len(wire) == 5 and all(type(x) is int for x in wire)):
            raise ProtocolError(f"shard_next reply: a task must be 5 integers, got {str(wire)[:80]}")
        lease = header.get("lease")
        if lease is not None and type(lease) is not int:
            raise ProtocolError(f"shard_next reply: the lease must be an integer, got {str(lease)[:80]}")
        return verdict, Task.from_wire(wire[0], wire[1:]), lease
    if verdict == "wait":
        held_by, mark = header.get("held_by", []), header.get("mark", 0)
        if not (isinstance(held_by, list) and all(type(t) is int for t in held_by) and type(mark) is int):
            raise ProtocolError("shard_next reply: a wait must name the trainers holding tasks (integers) and a mark")
        return verdict, Waiting(tuple(held_by[:64]), mark), None
    if verdict != "finished":
        raise ProtocolError(f"shard_next reply: unknown verdict {verdict!r}")
    return verdict, None, None


class Waiting(NamedTuple):
    """Why a trainer was told to wait: the trainers holding the pass's unfinished tasks, and a
    mark that moves whenever one of them reports progress."""
    held_by: tuple[int, ...]
    mark: int


def progress_request(links: Requests, trainer: int, pass_: int, step: int, task: int, position: int,
                     done: bool, lease: int | None = None) -> tuple:
    """The report of one step, sent in the step's fan-out (client/step.py riders); ``lease``: the
    one the task was handed out under (a report of an older one than the queue's is dropped)."""
    header = {"op": "shard_progress", "trainer": trainer, "pass": pass_, "step": step, "task": task,
              "position": position, "done": done, "epoch": links.epoch}
    if lease is not None:
        header["lease"] = lease
    return (SERVER, header, ())


def snapshot(links: Requests, mode, trainers: int, step: int, cut: dict[int, int] | None) -> dict | None:
    """The queue as of the checkpoint: async, the cut's steps (client/checkpoint.py); sync, the
    steps before ``step``. None when no data pass was ever registered (static shards)."""
    after = cut if cut is not None else ({t: step - 1 for t in range(trainers)}
                                         if Mode.parse(mode).server_mode is Mode.SYNC else None)
    request = {"op": "shard_snapshot", "trainer": 0, "epoch": links.epoch}
    if after is not None:
        request["after"] = [[t, k] for t, k in sorted(after.items())]
    header, _ = links.request(SERVER, request)
    state = header.get("state")
    if not isinstance(state, dict):
        raise ProtocolError("shard_snapshot reply without a 'state' map")
    return state if state.get("pass") else None


def restore(links: Requests, state) -> None:
    if not isinstance(state, dict):
        raise ConfigError(f"the checkpoint's shard queue must be a JSON object, got {type(state).__name__}")
    links.request(SERVER, {"op": "shard_restore", "trainer": 0, "state": state, "epoch": links.epoch})
