"""Trainer side of the dense requests (server side: paramshard.server.services.dense_handlers).

Parameters are flat float32 numpy views (over torch tensors' memory, say).
Every request carries all the blocks one server holds, so a step costs one
message per server, and all servers are asked at once. The ``*_requests``
methods build the messages so a trainer can send them together with its
sparse-table pushes in one fan-out.

Elastic jobs (PARAMSHARD_PARTITIONS): blocks move between servers (docs/DESIGN.md 5f). The
block -> server map comes with the job's Routing (its ``blocks``; empty: the plan's), which the
SparseClient this client ``follow``s fetches; requests carry its version. A request refused as
``moved`` (None from ``ServerLinks.collect``) is split again under the newest routing the trainer
knows and sent to the new owners (``settle``); server 0 is asked for a newer one only when that
is not newer than the routing the request was sent under (SparseClient.newer_than_refused).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from paramshard.errors import ConfigError
from paramshard.optim import OptimizerConfig
from paramshard.placement.sharding import Block, ShardPlan
from paramshard.transport.links import ServerLinks, check_reply_arrays


class DenseClient:
    def __init__(self, links: ServerLinks, plan: ShardPlan, trainer_id: int):
        if plan.num_servers > len(links):      # more links: servers an elastic job added since it started
            raise ConfigError(f"the plan is for {plan.num_servers} servers but the job has {len(links)}")
        self.links, self.plan, self.trainer_id = links, plan, trainer_id
        self.fingerprint = plan.fingerprint()
        self._blocks = {b.name: b for b in plan.blocks}
        self._by_server: dict[int, tuple[Block, ...]] = {
            s: plan.for_server(s) for s in range(plan.num_servers) if plan.for_server(s)}
        self.router = None          # the SparseClient whose routing (and its block map) this follows
        self._version: int | None = None
        self.resent = 0

    # -- where blocks live (elastic jobs) -------------------------------------------
    def follow(self, router) -> None:
        """Route by ``router.routing`` (a SparseClient's, kept fresh by it) from now on."""
        self.router = router
        self._update()

    def _update(self) -> None:
        if self.router is not None:
            self.router.catch_up_with_links()   # a server its routing names may have been let go (SparseClient)
        routing = self.router.routing if self.router is not None else None
        if routing is None or routing.version == self._version:
            return
        self._version = routing.version
        if routing.blocks:
            by_server: dict[int, list[Block]] = {}
            for b in self.plan.blocks:
                server = routing.blocks.get(b.name)
                if server is None:
                    raise ConfigError(f"the job's routing (version {routing.version}) does not place block "
                                      f"{b.name}: does this trainer build the model the chief registered?")
                by_server.setdefault(server, []).append(b)
            self._by_server = {s: tuple(bs) for s, bs in sorted(by_server.items())}

    def _tag(self, header: dict) -> dict:
        if self._version is not None:
            header["routing"] = self._version
        return header

    def _request(self, requests: list, timeout: float | None = None) -> tuple[list, list]:
        replies = self.links.request_list(requests, timeout)
        return self.settle(replies, requests)

    def settle(self, replies: list, requests: list) -> tuple[list, list]:
        """(requests, replies) with those refused as ``moved`` (None) sent again, split by a routing
        newer than the one each was refused under (a request is refused whole, so nothing of it
        was applied). Each round goes under a newer routing, so this ends with the move, or fails
        naming the refusing server when no newer routing comes."""
        if all(r is not None for r in replies) or self.router is None:
            return requests, replies
        self.router.newer_than_refused([q for q, r in zip(requests, replies) if r is None])
        self._update()
        kept = [(q, r) for q, r in zip(requests, replies) if r is not None]
        again = []
        for (server, header, arrays), reply in zip(requests, replies):
            if reply is not None:
                continue
            by_name = dict(zip(header["names"], arrays)) if arrays else {}
            for s, blocks in self._by_server.items():
                names = [b.name for b in blocks if b.name in header["names"]]
                if names:
                    again.append((s, {**header, "names": names, "routing": self._version},
                                  [by_name[n] for n in names] if arrays else ()))
        self.resent += len(again)
        more_requests, more_replies = self.settle(self.links.request_list(again), again)
        return [q for q, _ in kept] + list(more_requests), [r for _, r in kept] + list(more_replies)

    def catch_up(self, requests: list, replies: list) -> tuple[list, list]:
        """(requests, replies) with the bounded-staleness push replies that said ``follow`` (a move
        froze their blocks while they waited: the push is applied, it must not be sent again)
        replaced by a pull of the same blocks from their owners under a newer routing, gated at
        the same step (``resume_step``), so the values hold what the gate promised."""
        moved = [i for i, (header, _) in enumerate(replies) if header.get("follow") is not None]
        if not moved:
            return requests, replies
        if self.router is None:
            raise ConfigError(f"trainer {self.trainer_id}: a server said the dense blocks of its push moved, "
                              f"but this trainer follows no routing (DenseClient.follow)")
        self.router.newer_than_refused([requests[i] for i in moved])
        self._update()
        pulls = []
        for i in moved:
            names = set(requests[i][1]["names"])
            for server, blocks in self._by_server.items():
                mine = [b.name for b in blocks if b.name in names]
                if mine:
                    pulls.append((server, self._tag({
                        "op": "pull_dense", "names": mine, "trainer": self.trainer_id, "min_version": 0,
                        "plan_fingerprint": self.fingerprint, "epoch": self.links.epoch,
                        "resume_step": replies[i][0]["follow"]}), ()))
        self.resent += len(pulls)
        pull_requests, pull_replies = self._request(pulls)
        kept = [i for i in range(len(replies)) if i not in set(moved)]
        return ([requests[i] for i in kept] + list(pull_requests),
                [replies[i] for i in kept] + list(pull_replies))

    def register_dense(self, values: Mapping[str, np.ndarray], optimizer: OptimizerConfig,
                       timeout: float | None = None) -> None:
        requests = []
        for server, blocks in self._by_server.items():
            header = {"op": "register_dense", "trainer": self.trainer_id, "names": [b.name for b in blocks],
                      "optimizer": optimizer.to_wire(), "plan_fingerprint": self.fingerprint}
            requests.append((server, header, [self._slice(values, b) for b in blocks]))
        self.links.request_list(requests, timeout)

    def pull_dense(self, out: Mapping[str, np.ndarray], min_version: int,
                   timeout: float | None = None) -> int:
        """Copy every block (at least at ``min_version``) into ``out``'s flat arrays;
        returns the highest block version seen (the step count, in sync mode)."""
        self._update()
        requests = [(server, self._tag({"op": "pull_dense", "names": [b.name for b in blocks], "trainer": self.trainer_id,
                              "min_version": min_version, "plan_fingerprint": self.fingerprint,
                              "epoch": self.links.epoch}), ())
                    for server, blocks in self._by_server.items()]
        requests, replies = self._request(requests, timeout)
        self.scatter(requests, replies, out)
        return max((max(header.get("versions") or [0]) for header, _ in replies), default=0)

    def push_requests(self, grads: Mapping[str, np.ndarray], step: int, want_values: bool,
                      resume_step: int | None = None) -> list:
        self._update()
        requests = []
        for server, blocks in self._by_server.items():
            header = {"op": "push_dense", "names": [b.name for b in blocks], "step": step,
                      "trainer": self.trainer_id, "reply_values": want_values, "epoch": self.links.epoch}
            if resume_step is not None:
                header["resume_step"] = resume_step
            requests.append((server, self._tag(header), [self._slice(grads, b) for b in blocks]))
        return requests

    def push_dense(self, grads: Mapping[str, np.ndarray], step: int,
                   out: Mapping[str, np.ndarray] | None = None, timeout: float | None = None) -> None:
        """Push step ``step``'s gradients; with ``out``, also receive the updated
        values in the same round trip (sync mode: after every trainer's push)."""
        requests = self.push_requests(grads, step, out is not None)
        requests, replies = self._request(requests, timeout)
        if out is not None:
            self.scatter(requests, replies, out)

    def scatter(self, requests: list, replies: list, out: Mapping[str, np.ndarray]) -> None:
        """Copy the blocks in the replies to ``requests`` into ``out`` (settled: no None)."""
        replies = self._replayed_values(requests, replies)
        for (server, request, _), (header, arrays) in zip(requests, replies):
            blocks = [self._blocks[n] for n in request["names"]]
            check_reply_arrays(header, arrays, [b.size for b in blocks], f"server {server}")
            for block, arr in zip(blocks, arrays):
                out[block.param][block.offset:block.offset + block.size] = arr

    def _replayed_values(self, requests: list, replies: list) -> list:
        """``replies`` with those to a push that asked for values but was answered ``replayed``
        (resent to a server restored from its replica, which held it already: bounded-loss
        recovery, transport/links.py) replaced by a pull of the same blocks from that server."""
        again = [i for i, (header, _) in enumerate(replies)
                 if header.get("replayed") and requests[i][1].get("reply_values")]
        if not again:
            return replies
        pulls = [(requests[i][0], self._tag({
            "op": "pull_dense", "names": requests[i][1]["names"], "trainer": self.trainer_id, "min_version": 0,
            "plan_fingerprint": self.fingerprint, "epoch": self.links.epoch}), ()) for i in again]
        out = list(replies)
        for i, reply in zip(again, self.links.request_list(pulls)):
            out[i] = reply
        return out

    @staticmethod
    def _slice(flat: Mapping[str, np.ndarray], block: Block) -> np.ndarray:
        try:
            arr = flat[block.param]
        except KeyError:
            raise ConfigError(f"no array given for parameter {block.param!r}") from None
        return arr[block.offset:block.offset + block.size]


if TYPE_CHECKING:   # `make typecheck` checks the contract: DenseSync (dense_sync.py)
    from paramshard.dense_sync import DenseSync
    _dense_sync: type[DenseSync] = DenseClient
