"""A shard task as server 0's data-shard queue and the trainers exchange it: (id, file index,
start, end, kind). Making tasks from files is data/shards/tasks.py (the trainer's side); the
queue (server/elastic/shard_queue.py) and the requests (client/shards.py) need only this, so
a server imports nothing of data/."""
from __future__ import annotations

import dataclasses

KINDS = ("bytes", "gzip", "rows")
MAX_TASKS = 20_000    # the service's bound too; a list of them fits a wire header (1 MiB)


@dataclasses.dataclass(frozen=True)
class Task:
    id: int
    file: int        # index into the task list's files
    start: int       # bytes: byte offset; rows: row number; gzip: records to skip
    end: int         # exclusive; -1: to the end of the file (gzip)
    kind: str

    def to_wire(self) -> list:
        return [self.file, self.start, self.end, KINDS.index(self.kind)]

    @classmethod
    def from_wire(cls, task_id: int, wire) -> "Task":
        file, start, end, kind = wire
        return cls(task_id, file, start, end, KINDS[kind])

    def rest(self, position: int) -> "Task":
        """The part of this task from ``position`` on (a reader's next unread record)."""
        return dataclasses.replace(self, start=position)
