"""Bounded-loss recovery, server side: what changed since the keeper's last copy, and replays.

With PARAMSHARD_RECOVERY=bounded-loss (async mode) the launcher's replica keeper
(launch/elastic/replica_keeper.py) asks every server for ``replica_delta`` a few times a
second: the first answer is a whole copy, the next ones only what changed since:

- dense blocks whose version moved (whole blocks, with their optimizer slots);
- sparse rows by page of PAGE_ROWS row handles: a push marks the pages of the rows
  it updated, a pull that creates rows marks the new ones; an eviction or an
  import marks the whole table (row handles move). Admission counters travel whole
  with every delta of a table that counts. Last-seen versions travel with the
  pages, but a pull's touch alone does not mark a page (eviction may then come a
  little late after a restore);
- the learning-rate scales, and each trainer's last applied step per stream.

A reply carries at most MAX_DELTA_BYTES of pages (``more``: ask again at once).
Each reply is numbered (``seq``); a request names the last one its keeper folded in
(``since``), and any other number (a lost reply, a second caller, -1) gets a whole copy.

A server restarted in place (epoch -1) gets the replica back through the ordinary
restore ops (register_sparse, restore_dense, restore_sparse, as a checkpoint
restore does), then ``replica_resume`` puts it in the job's epoch with the
trainers' last applied steps. From then on a push whose step is not newer than
its trainer's last applied one on that stream is a replay (the trainer resent it
because the old server died before answering, or the socket delivered a queued
copy): refused with code ``applied``, which the resending trainer counts as done
(transport/links.py). Steps per trainer and stream only grow in async mode.
"""
from __future__ import annotations

import zlib

import numpy as np
from typing import TYPE_CHECKING


from paramshard.errors import AlreadyApplied, ConfigError
from paramshard.log import get_logger
from paramshard.tables import policy_to_wire
from paramshard.server.core.context import ServerContext
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.core.replies import Reply
from paramshard.server.services.sparse_service import SparseService

log = get_logger("server")

PAGE_ROWS = 4096
MAX_DELTA_BYTES = 32 << 20
PUSH_OPS = ("push_dense", "push_sparse")


def stream_of(op: str, header: dict) -> str:
    """The sequence a push belongs to: dense blocks, or one sparse table."""
    return "dense" if op == "push_dense" else f"sparse:{header['table']}"


class DirtyPages:
    """Which pages of ``page_rows`` row handles changed since the last ``take``; starts whole.
    One flag a page: a push costs a division and a scatter over its rows, no sort."""

    def __init__(self, page_rows: int = PAGE_ROWS):
        self.page_rows = page_rows
        self.whole = True
        self._flags = np.zeros(0, bool)

    def _fit(self, pages: int) -> None:
        if len(self._flags) < pages:
            grown = np.zeros(max(pages, 2 * len(self._flags)), bool)
            grown[:len(self._flags)] = self._flags
            self._flags = grown

    def rows(self, handles: np.ndarray) -> None:
        if self.whole or not len(handles):
            return
        pages = np.asarray(handles) // self.page_rows
        try:
            self._flags[pages] = True
        except IndexError:                  # rows made by a path that said nothing: make room
            self._fit(int(pages.max()) + 1)
            self._flags[pages] = True

    def grew(self, old: int, new: int) -> None:
        if not self.whole and new > old:
            last = (new - 1) // self.page_rows
            self._fit(last + 1)
            self._flags[old // self.page_rows:last + 1] = True

    def everything(self) -> None:
        self.whole = True
        self._flags[:] = False

    def take(self, num_rows: int) -> tuple[bool, list[int]]:
        """(whole, the changed pages that exist, ascending) and start over."""
        count = (num_rows + self.page_rows - 1) // self.page_rows
        whole = self.whole
        pages = list(range(count)) if whole else np.flatnonzero(self._flags[:count]).tolist()
        self._flags[:] = False
        self._fit(count)
        self.whole = False
        return whole, pages

    def give_back(self, pages: list[int]) -> None:
        """Pages taken but not sent (a reply full): marked again."""
        if pages and not self.whole:
            self._fit(max(pages) + 1)
            self._flags[pages] = True


class ReplayGuard:
    """A RequestHook (server/core/hooks.py): which pushes of each trainer and stream this server holds, and
    a refusal for one it holds already (a replay after a restore).

    Held: every step up to ``floor`` (what a restored copy holds, or what fell out of the window),
    and the steps in ``recent`` above it. A set, not just the highest step: a trainer with pushes in
    flight resends the one the dead server never answered after a newer one already reached the
    replacement, so steps may arrive out of order here.

    Above the floor a push is known by its step and what it carries (routing version, the dense
    blocks it names, a checksum of its sparse ids): in an elastic job parts of a step's pushes
    refused as ``moved`` go again to their new owners (client/sparse.py, client/dense.py settle),
    so one server may rightly take several pushes of one step, each with other rows or blocks;
    a replay resends the very request, and is known by the same key."""

    WINDOW = 256        # steps kept above the floor; a push is never this far behind its trainer's newest

    def __init__(self):
        self.floor: dict[str, dict[int, int]] = {}          # stream -> trainer -> every step <= it is held
        self.recent: dict[str, dict[int, set]] = {}         # stream -> trainer -> (step, routing) held above it

    def holds(self, stream: str, trainer: int, step: int, content=None) -> bool:
        return (step <= self.floor.get(stream, {}).get(trainer, -1)
                or (step, content) in self.recent.get(stream, {}).get(trainer, ()))

    @staticmethod
    def content(request: Incoming):
        """What tells two pushes of one step apart (None: a job whose servers never change)."""
        header = request.header
        if header.get("routing") is None:
            return None
        if request.op == "push_dense":
            return header["routing"], tuple(header["names"])
        frames = request.held
        ids = zlib.crc32(frames[2].buffer) if frames is not None and len(frames) > 2 else None
        return header["routing"], ids

    def admit(self, request: Incoming) -> Verdict:
        if request.op in PUSH_OPS:
            step, trainer = request.header["step"], request.pusher()
            stream = stream_of(request.op, request.header)
            if self.holds(stream, trainer, step, self.content(request)):
                raise AlreadyApplied(f"{request.op} of trainer {trainer} step {step}: this server already holds "
                                     f"it (a push resent after a restore)")
        return Verdict.ACCEPT

    def applied(self, request: Incoming) -> None:
        if request.op not in PUSH_OPS:
            return
        stream, trainer = stream_of(request.op, request.header), request.pusher()
        steps = self.recent.setdefault(stream, {}).setdefault(trainer, set())
        steps.add((request.header["step"], self.content(request)))
        if len(steps) > self.WINDOW:
            floor = max(s for s, _ in steps) - self.WINDOW // 2
            self.floor.setdefault(stream, {})[trainer] = max(floor, self.floor.get(stream, {}).get(trainer, -1))
            steps.difference_update([k for k in steps if k[0] <= floor])

    def tick(self) -> None:
        pass

    def newest(self) -> dict[str, dict[int, int]]:
        """stream -> trainer -> the newest step held."""
        out: dict[str, dict[int, int]] = {}
        for table in (self.floor, self.recent):
            for stream, trainers in table.items():
                for t, v in trainers.items():
                    if isinstance(v, set) and not v:
                        continue
                    top = max(s for s, _ in v) if isinstance(v, set) else v
                    out.setdefault(stream, {})[t] = max(top, out.get(stream, {}).get(t, -1))
        return out

    def wire(self) -> dict:
        """What a copy holds: on the server it comes from every push of a trainer reached it in order
        (one connection), so everything up to the newest step is held there."""
        return {stream: sorted([t, s] for t, s in steps.items()) for stream, steps in self.newest().items()}

    def restore(self, wire: dict) -> None:
        if not isinstance(wire, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and all(
                    isinstance(p, list) and len(p) == 2 and all(type(x) is int for x in p) for p in v)
                for k, v in wire.items()):
            raise ConfigError("replica_resume: 'steps' must map streams to [trainer, step] pairs")
        self.floor = {stream: {t: s for t, s in pairs} for stream, pairs in wire.items()}
        self.recent = {}


class ReplicationService:
    """The ``replica_delta`` and ``replica_resume`` ops as a Service (server/core/api.py)."""

    def __init__(self, dense: DenseStore, sparse: SparseService | None, context: ServerContext):
        self.dense, self.sparse, self.context = dense, sparse, context
        self.guard = ReplayGuard()
        self._dense_sent: dict[str, int] = {}          # block -> version in the keeper's copy
        self._seq = 0                                   # replies given; the keeper names the last it holds
        self._pages: dict[str, DirtyPages] = {}        # table -> its change log

    def ops(self) -> dict:
        return {"replica_delta": self.handle_replica_delta, "replica_resume": self.handle_replica_resume}

    def hooks(self) -> list:
        return [self.guard]

    def stats(self) -> None:
        return None

    def on_leave(self, trainer: int) -> None:
        pass

    def reset(self) -> None:
        self._dense_sent, self._pages = {}, {}
        self.guard.floor, self.guard.recent = {}, {}

    # -- the copy -----------------------------------------------------------
    def handle_replica_delta(self, header: dict, arrays: list) -> Reply:
        full = header["since"] != self._seq
        if full:            # the keeper is new, lost a reply, or someone else asked meanwhile: everything again
            self._dense_sent = {}
            for pages in self._pages.values():
                pages.everything()
        self._seq += 1
        out: list[np.ndarray] = []
        fields = {"epoch": self.context.epoch, "dense": self._dense_delta(out), "steps": self.guard.wire(),
                  "seq": self._seq, "full": full}
        budget = [MAX_DELTA_BYTES - sum(a.nbytes for a in out)]
        tables, more = {}, False
        for name, table in (self.sparse.tables.items() if self.sparse else ()):
            tables[name], cut = self._table_delta(name, table, out, budget)
            more = more or cut
        fields.update(tables=tables, more=more)
        return Reply(fields, out)

    def _dense_delta(self, out: list) -> dict | None:
        store = self.dense
        if not store.registered:
            return None
        changed = [b for b in store.blocks.values() if self._dense_sent.get(b.name) != b.version]
        for b in changed:
            out.append(b.values.copy())
            out.extend(s.copy() for s in b.slots)
            self._dense_sent[b.name] = b.version
        return {"names": [b.name for b in changed], "versions": [b.version for b in changed],
                "slots": len(next(iter(store.blocks.values())).slots) if store.blocks else 0,
                "optimizer": store.registered_optimizer().to_wire(), "plan_fingerprint": store.plan_fingerprint,
                "lr_scale": store.lr_scale, "all": sorted(store.blocks)}

    def _table_delta(self, name: str, table, out: list, budget: list) -> tuple[dict, bool]:
        pages = self._pages.get(name)
        if pages is None or table.changes is not pages:
            pages = self._pages[name] = table.changes = DirtyPages(PAGE_ROWS)
            table.create_on_push = True
        whole, dirty = pages.take(table.num_rows)
        sent: list[int] = []
        parts: list[list[str]] = []
        for i, page in enumerate(dirty):
            if budget[0] <= 0 and sent:
                pages.give_back(dirty[i:])
                break
            got = table.page(page * PAGE_ROWS, PAGE_ROWS)
            parts.append(list(got))
            out.extend(got.values())
            budget[0] -= sum(a.nbytes for a in got.values())
            sent.append(page)
        counters = table.counters()
        if counters is not None:
            out.extend(counters)
        spec = {"table": name, "dim": table.dim, "seed": table.seed, "optimizer": table.optimizer.to_wire(),
                "policy": policy_to_wire(table.admission, table.eviction, table.init_scale),
                "dtype": table.dtype, "rounding": table.rounding}
        if table.memory_budget is not None:
            spec["memory_budget"] = table.memory_budget
        return ({"spec": spec, "slot_widths": list(table.rule.slot_widths(table.dim)), "version": table.version, "evicted": table.evicted, "lr_scale": table.lr_scale,
                 "rows": table.num_rows, "whole": whole, "pages": sent, "parts": parts,
                 "counters": counters is not None}, len(sent) < len(dirty))

    # -- back in service --------------------------------------------------------
    def handle_replica_resume(self, header: dict, arrays: list) -> Reply:
        """A restarted server, its replica restored, serves again in the job's epoch."""
        ctx, epoch = self.context, header["epoch"]
        if ctx.epoch != -1:
            raise ConfigError(f"replica_resume: {ctx.name} is in epoch {ctx.epoch}, not restarted (-1): "
                              f"only a server restarted in place resumes from a replica")
        if epoch < 0:
            raise ConfigError(f"replica_resume: epoch {epoch} must be >= 0")
        self.guard.restore(header["steps"])
        for table in (self.sparse.tables.values() if self.sparse else ()):
            table.create_on_push = True
        ctx.epoch = epoch
        log.warning("%s: restored from the replica; serving in epoch %d", ctx.name, epoch)
        return Reply({"generation": epoch})


def attach_replication(server) -> ReplicationService:
    service = ReplicationService(server.dense, server.service(SparseService), server.context)
    server.add_service(service)
    return service


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py), RequestHook (server/core/hooks.py)
    from paramshard.server.core.api import Service
    from paramshard.server.core.hooks import RequestHook
    _service: type[Service] = ReplicationService
    _request_hook: type[RequestHook] = ReplayGuard
