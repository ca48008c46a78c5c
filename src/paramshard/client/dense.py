"""Trainer side of the dense requests (server side: paramshard.server.dense_handlers).

Parameters are flat float32 numpy views (over torch tensors' memory, say).
Every request carries all the blocks one server holds, so a step costs one
message per server, and all servers are asked at once. The ``*_requests``
methods build the messages so a trainer can send them together with its
sparse-table pushes in one fan-out.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import ConfigError
from ..optim import OptimizerConfig
from ..placement.sharding import Block, ShardPlan
from ..transport.client import ServerLinks, check_reply_arrays


class DenseClient:
    def __init__(self, links: ServerLinks, plan: ShardPlan, trainer_id: int):
        if plan.num_servers != len(links):
            raise ConfigError(f"the plan is for {plan.num_servers} servers but the job has {len(links)}")
        self.links, self.plan, self.trainer_id = links, plan, trainer_id
        self.fingerprint = plan.fingerprint()
        self._by_server: dict[int, tuple[Block, ...]] = {
            s: plan.for_server(s) for s in range(plan.num_servers) if plan.for_server(s)}

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
        requests = [(server, {"op": "pull_dense", "names": [b.name for b in blocks], "trainer": self.trainer_id,
                              "min_version": min_version, "plan_fingerprint": self.fingerprint,
                              "epoch": self.links.epoch}, ())
                    for server, blocks in self._by_server.items()]
        replies = self.links.request_list(requests, timeout)
        self.scatter(requests, replies, out)
        return max((max(header.get("versions") or [0]) for header, _ in replies), default=0)

    def push_requests(self, grads: Mapping[str, np.ndarray], step: int, want_values: bool,
                      resume_step: int | None = None) -> list:
        requests = []
        for server, blocks in self._by_server.items():
            header = {"op": "push_dense", "names": [b.name for b in blocks], "step": step,
                      "trainer": self.trainer_id, "reply_values": want_values, "epoch": self.links.epoch}
            if resume_step is not None:
                header["resume_step"] = resume_step
            requests.append((server, header, [self._slice(grads, b) for b in blocks]))
        return requests

    def push_dense(self, grads: Mapping[str, np.ndarray], step: int,
                   out: Mapping[str, np.ndarray] | None = None, timeout: float | None = None) -> None:
        """Push step ``step``'s gradients; with ``out``, also receive the updated
        values in the same round trip (sync mode: after every trainer's push)."""
        requests = self.push_requests(grads, step, out is not None)
        replies = self.links.request_list(requests, timeout)
        if out is not None:
            self.scatter(requests, replies, out)

    def scatter(self, requests: list, replies: list, out: Mapping[str, np.ndarray]) -> None:
        """Copy the blocks in the replies to ``requests`` into ``out``."""
        for (server, _, _), (header, arrays) in zip(requests, replies):
            blocks = self._by_server[server]
            check_reply_arrays(header, arrays, [b.size for b in blocks], f"server {server}")
            for block, arr in zip(blocks, arrays):
                out[block.param][block.offset:block.offset + block.size] = arr

    @staticmethod
    def _slice(flat: Mapping[str, np.ndarray], block: Block) -> np.ndarray:
        try:
            arr = flat[block.param]
        except KeyError:
            raise ConfigError(f"no array given for parameter {block.param!r}") from None
        return arr[block.offset:block.offset + block.size]
