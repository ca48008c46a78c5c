"""Dense blocks on one server and the sync barrier over them.

Sync mode: a block's step-k update waits until every live trainer has pushed
its step-k gradient for that block; the gradients are averaged (each trainer
sends the gradient of its own mean loss, so the average is the gradient of the
mean loss over the union of their batches). Async mode: each push is applied
on arrival. ``version`` counts applied updates; a pull may wait for a version.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..optim import OptimizerConfig
from .optimizers import Rule, make_rule


class DenseBlock:
    __slots__ = ("name", "values", "rule", "slots", "version", "acc", "contributors")

    def __init__(self, name: str, values: np.ndarray, rule: Rule):
        self.name = name
        self.values = values          # allocated once, updated in place
        self.rule = rule
        self.slots = rule.init_slots(values.shape)
        self.version = 0
        self.acc: np.ndarray | None = None   # sync-mode gradient sum, allocated on first use
        self.contributors: set[int] = set()


class DenseStore:
    def __init__(self, mode: str, num_trainers: int):
        self.mode = mode
        self.live_trainers = set(range(num_trainers))
        self.blocks: dict[str, DenseBlock] = {}
        self.plan_fingerprint: int | None = None

    # -- registration ---------------------------------------------------
    def register(self, names: list[str], arrays: list[np.ndarray], optimizer: OptimizerConfig,
                 plan_fingerprint: int) -> None:
        clash = [n for n in names if n in self.blocks]
        if clash:
            raise ConfigError(f"blocks already registered: {clash[:3]}; a second chief, or a "
                              f"restarted job talking to old servers? restart the servers")
        if len(set(names)) != len(names):
            raise ConfigError("the same block name appears twice in one registration")
        rule = make_rule(optimizer)
        for name, arr in zip(names, arrays):
            if arr.dtype != np.float32 or arr.ndim != 1:
                raise ConfigError(f"block {name}: expected a flat float32 array, got {arr.dtype}{list(arr.shape)}")
            self.blocks[name] = DenseBlock(name, arr.copy(), rule)
        self.plan_fingerprint = plan_fingerprint

    def has_all(self, names: list[str]) -> bool:
        return all(n in self.blocks for n in names)

    def lookup(self, names: list[str]) -> list[DenseBlock]:
        missing = [n for n in names if n not in self.blocks]
        if missing:
            raise ConfigError(f"unknown blocks {missing[:3]} (of {len(missing)}): not in this "
                              f"server's share of the plan; do all trainers build the same model?")
        return [self.blocks[n] for n in names]

    def versions_reached(self, names: list[str], version: int) -> bool:
        return all(n in self.blocks and self.blocks[n].version >= version for n in names)

    # -- updates --------------------------------------------------------
    def push(self, trainer: int, step: int, names: list[str], grads: list[np.ndarray]) -> None:
        blocks = self.lookup(names)
        for block, grad in zip(blocks, grads):
            if grad.shape != block.values.shape or grad.dtype != np.float32:
                raise ConfigError(f"block {block.name}: gradient is {grad.dtype}{list(grad.shape)}, "
                                  f"the block is float32{list(block.values.shape)}")
        if self.mode == "async":
            for block, grad in zip(blocks, grads):
                self._apply(block, grad)
            return
        if trainer not in self.live_trainers:
            raise ConfigError(f"trainer {trainer} already left or is not part of this job")
        for block in blocks:   # check everything before changing anything
            if step != block.version:
                raise ConfigError(f"trainer {trainer} pushed step {step} for {block.name}, which is "
                                  f"at step {block.version}; every trainer must push every step once")
            if trainer in block.contributors:
                raise ConfigError(f"trainer {trainer} pushed step {step} for {block.name} twice")
        for block, grad in zip(blocks, grads):
            if not block.contributors and self.live_trainers <= {trainer}:
                # The only trainer left: apply straight from the received frame,
                # no copy into an accumulator.
                self._apply(block, grad)
                continue
            if block.acc is None:
                block.acc = np.empty_like(block.values)
            if block.contributors:
                block.acc += grad
            else:
                block.acc[...] = grad
            block.contributors.add(trainer)
            self._maybe_finish_step(block)

    def leave(self, trainer: int) -> None:
        self.live_trainers.discard(trainer)
        if self.mode == "sync":
            for block in self.blocks.values():
                self._maybe_finish_step(block)

    def waiting_for(self, names: list[str]) -> list[int]:
        """Live trainers that have not pushed the current step of these blocks."""
        missing: set[int] = set()
        for n in names:
            block = self.blocks.get(n)
            if block is not None:
                missing |= self.live_trainers - block.contributors
        return sorted(missing)

    def _maybe_finish_step(self, block: DenseBlock) -> None:
        if block.contributors and self.live_trainers <= block.contributors:
            # The average folds into the update: no extra pass over the block.
            self._apply(block, block.acc, scale=1.0 / len(block.contributors))
            block.contributors.clear()

    def _apply(self, block: DenseBlock, grad: np.ndarray, scale: float = 1.0) -> None:
        block.rule.apply(block.values, grad, block.slots, block.version + 1, scale)
        block.version += 1

    @property
    def elements(self) -> int:
        return sum(b.values.size for b in self.blocks.values())
