"""Dense blocks on one server and the sync barrier over them.

Sync mode: a block's step-k update waits until every live trainer has pushed
its step-k gradient for that block; the gradients are averaged (each trainer
sends the gradient of its own mean loss, so the average is the gradient of the
mean loss over the union of their batches). Async mode: each push is applied
on arrival. ``version`` counts applied updates; a pull may wait for a version.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from paramshard.errors import ConfigError
from paramshard.mode import Mode
from paramshard.optim import OptimizerConfig, check_dense, check_lr_scale, scaled
from paramshard.server.core.barrier import Membership, StepBarrier
from paramshard.update_rules import Rule, make_rule
from paramshard.server.services.staleness import Clocks


class DenseBlock:
    __slots__ = ("name", "values", "rule", "slots", "version", "acc", "barrier")

    def __init__(self, name: str, values: np.ndarray, rule: Rule, barrier: StepBarrier):
        self.name = name
        self.values = values          # allocated once, updated in place
        self.rule = rule
        self.slots = rule.init_slots(values.shape)
        self.version = 0
        self.acc: np.ndarray | None = None   # sync-mode gradient sum, allocated on first use
        self.barrier = barrier


def check_distinct(names: list, what: str) -> None:
    if len(set(names)) != len(names):
        twice = sorted(n for n, count in Counter(names).items() if count > 1)
        raise ConfigError(f"{what} names {twice[:3]} more than once; each block may appear once")


class DenseStore:
    def __init__(self, mode: str | Mode, membership: Membership, max_staleness: int | None = None):
        self.mode = Mode.parse(mode)
        self.membership = membership
        self.clocks = Clocks(membership, max_staleness)    # async only
        self.last_staleness: int | None = None
        self.blocks: dict[str, DenseBlock] = {}
        # Blocks frozen for a move to another server (server/elastic/dense_migration.py keeps this set):
        # requests naming them are refused, and a bounded-staleness reply waiting on them is
        # answered with ``follow`` (server/services/dense_handlers.py).
        self.handed_away: set[str] = set()
        self.plan_fingerprint: int | None = None
        self.optimizer: OptimizerConfig | None = None    # as registered: the base learning rate
        # The product of every learning-rate change so far (Trainer.scale_learning_rate): the
        # blocks' rule runs at optimizer.lr x lr_scale. Checkpointed with the blocks.
        self.lr_scale = 1.0

    @property
    def registered(self) -> bool:
        return self.plan_fingerprint is not None

    # -- registration ---------------------------------------------------
    def register(self, trainer: int, names: list[str], arrays: list[np.ndarray], optimizer: OptimizerConfig,
                 plan_fingerprint: int) -> bool:
        """All or nothing: every block is checked before any is stored. Only the
        chief registers; a repeat of the identical registration is accepted and
        changes nothing (returns False)."""
        self.membership.check_trainer(trainer)
        check_distinct(names, "register_dense")
        if self.registered:
            same = (plan_fingerprint == self.plan_fingerprint and optimizer == self.optimizer
                    and sorted(names) == sorted(self.blocks))
            if same:
                return False
            raise ConfigError(f"trainer {trainer} tried to register a different model (plan {plan_fingerprint:#x}) "
                              f"on servers that hold the chief's (plan {self.plan_fingerprint:#x}): a second chief, "
                              f"or a new job talking to old servers? every trainer must build the same model")
        if trainer != 0:
            raise ConfigError(f"trainer {trainer} tried to register the model: only the chief (trainer 0) registers")
        if len(names) != len(arrays):
            raise ConfigError(f"register_dense names {len(names)} blocks but carries {len(arrays)} arrays")
        for name, arr in zip(names, arrays):
            if arr.dtype != np.float32 or arr.ndim != 1:
                raise ConfigError(f"block {name}: expected a flat float32 array, got {arr.dtype}{list(arr.shape)}")
        check_dense(optimizer, "register_dense")
        rule = make_rule(scaled(optimizer, self.lr_scale))
        self.blocks = {name: DenseBlock(name, arr.copy(), rule, StepBarrier(self.membership, f"block {name}"))
                       for name, arr in zip(names, arrays)}
        self.plan_fingerprint, self.optimizer = plan_fingerprint, optimizer
        return True

    def registered_optimizer(self) -> OptimizerConfig:
        """The optimizer of the registered model, asked only where ``registered`` holds: register and
        dense_import set it with the plan, forget clears both."""
        assert self.optimizer is not None, "the dense optimizer asked of a server with no model registered"
        return self.optimizer

    def set_lr_scale(self, scale: float) -> None:
        """Run every block's rule at the registered rate x ``scale`` from the next update on
        (``lr_scale`` is kept even before registration: a restore sets it first)."""
        scale = check_lr_scale(scale, "dense blocks")
        if self.optimizer is not None:      # None: no model, no blocks (register sets both)
            rule = make_rule(scaled(self.optimizer, scale))
            for block in self.blocks.values():      # every check passed: nothing fails from here
                block.rule = rule
        self.lr_scale = scale

    def forget(self) -> None:
        """Drop the model (a rollback: the chief restores the checkpoint's, with its scale)."""
        self.blocks, self.plan_fingerprint, self.optimizer, self.lr_scale = {}, None, None, 1.0

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

    # -- moving blocks to another server (server/elastic/dense_migration.py) -----------
    def export_blocks(self, names: list[str]) -> tuple[dict, list[np.ndarray]]:
        """Everything a block is, for its new owner: values and optimizer slots (copies, as
        arrays: values then slots per block), versions, and the store's optimizer, plan and
        learning-rate scale (a new server has none of them yet)."""
        if not self.registered:
            raise ConfigError("dense_export: no model is registered on this server")
        check_distinct(names, "dense_export")
        blocks = self.lookup(names)
        arrays = []
        for b in blocks:
            if b.barrier.arrived:
                raise ConfigError(f"dense_export: block {b.name} is in the middle of a sync step "
                                  f"(trainers {sorted(b.barrier.arrived)} pushed); export between steps")
            arrays.append(b.values.copy())
            arrays.extend(slot.copy() for slot in b.slots)
        fields = {"names": list(names), "versions": [b.version for b in blocks],
                  "slots": len(blocks[0].slots) if blocks else 0, "optimizer": self.registered_optimizer().to_wire(),
                  "plan_fingerprint": self.plan_fingerprint, "lr_scale": self.lr_scale}
        if not self.mode.waits_every_step:
            fields["clocks"] = self.clocks.export(list(names))
        return fields, arrays

    def import_blocks(self, names: list[str], versions: list[int], n_slots: int, arrays: list[np.ndarray],
                      optimizer: OptimizerConfig, plan_fingerprint: int, lr_scale: float,
                      clocks: list | None = None) -> None:
        """Take blocks another server exported (``export_blocks``). All checked before any is
        stored; a server holding a model must hold the same plan, optimizer and scale.
        ``clocks`` (async): the exporter's staleness clocks of each block, merged into this server's."""
        check_distinct(names, "dense_import")
        if clocks is not None and not (len(clocks) == len(names) and all(isinstance(per, list) and all(
                isinstance(p, list) and len(p) == 2 and all(type(x) is int and x >= 0 for x in p) for p in per)
                for per in clocks)):
            raise ConfigError("dense_import: clocks must be, for each block, a list of [trainer, clock] pairs "
                              "of integers >= 0")
        per_block = 1 + n_slots
        if len(versions) != len(names) or len(arrays) != per_block * len(names):
            raise ConfigError(f"dense_import: {len(names)} blocks, {len(versions)} versions and {len(arrays)} "
                              f"arrays do not fit ({per_block} arrays a block)")
        if any(type(v) is not int or v < 0 for v in versions):
            raise ConfigError("dense_import: versions must be integers >= 0")
        if self.registered and (plan_fingerprint != self.plan_fingerprint or optimizer != self.optimizer
                                or lr_scale != self.lr_scale):
            raise ConfigError("dense_import: the blocks come from a different model (plan, optimizer or "
                              "learning-rate scale) than the one this server holds")
        already = [n for n in names if n in self.blocks]
        if already:
            raise ConfigError(f"dense_import: this server already holds blocks {already[:3]}")
        check_dense(optimizer, "dense_import")
        rule = make_rule(scaled(optimizer, check_lr_scale(lr_scale, "dense_import")))
        if len(rule.init_slots((0,))) != n_slots:
            raise ConfigError(f"dense_import: {n_slots} optimizer slots a block, {optimizer.kind} keeps "
                              f"{len(rule.init_slots((0,)))}")
        for name, i in zip(names, range(0, len(arrays), per_block)):
            group = arrays[i:i + per_block]
            if any(a.dtype != np.float32 or a.ndim != 1 or a.shape != group[0].shape for a in group):
                raise ConfigError(f"dense_import: block {name}: values and slots must be flat float32 "
                                  f"arrays of one length")
        if not self.registered:
            self.plan_fingerprint, self.optimizer, self.lr_scale = plan_fingerprint, optimizer, lr_scale
        rule = next(iter(self.blocks.values())).rule if self.blocks else rule
        for name, version, i in zip(names, versions, range(0, len(arrays), per_block)):
            block = DenseBlock(name, arrays[i].copy(), rule, StepBarrier(self.membership, f"block {name}"))
            block.slots = [a.copy() for a in arrays[i + 1:i + per_block]]
            block.version = version
            self.blocks[name] = block
        if clocks is not None and not self.mode.waits_every_step:
            self.clocks.merge(names, clocks)

    def drop_blocks(self, names: list[str]) -> int:
        """Forget blocks handed to another server; the plan stays registered."""
        self.clocks.forget(names)
        return sum(self.blocks.pop(n, None) is not None for n in names)

    # -- updates --------------------------------------------------------
    def push(self, trainer: int, step: int, names: list[str], grads: list[np.ndarray]) -> None:
        self.membership.check_trainer(trainer)
        check_distinct(names, "push_dense")
        if len(names) != len(grads):
            raise ConfigError(f"push_dense names {len(names)} blocks but carries {len(grads)} arrays")
        blocks = self.lookup(names)
        for block, grad in zip(blocks, grads):
            if grad.shape != block.values.shape or grad.dtype != np.float32:
                raise ConfigError(f"block {block.name}: gradient is {grad.dtype}{list(grad.shape)}, "
                                  f"the block is float32{list(block.values.shape)}")
        self.membership.check_not_left(trainer, "push again")
        if not self.mode.waits_every_step:      # async: applied on arrival
            for block, grad in zip(blocks, grads):
                self._apply(block, grad)
            self.last_staleness = self.clocks.pushed(trainer, step, names)
            return
        for block in blocks:   # check everything before changing anything
            block.barrier.check_arrival(trainer, step, block.version)
        for block, grad in zip(blocks, grads):
            if not block.barrier.arrived and self.membership.required_for(step) <= {trainer}:
                # The only trainer left: apply straight from the received frame,
                # no copy into an accumulator.
                self._apply(block, grad)
                continue
            if block.acc is None:
                block.acc = np.empty_like(block.values)
            if block.barrier.arrived:
                block.acc += grad
            else:
                block.acc[...] = grad
            block.barrier.arrive(trainer)
            self._maybe_finish_step(block)

    def on_leave(self, trainer: int) -> None:
        """A trainer left: steps that only waited for it are complete now."""
        if self.mode.waits_every_step:
            for block in self.blocks.values():
                self._maybe_finish_step(block)

    def waiting_for(self, names: list[str]) -> list[int]:
        """Trainers that have not pushed the current step of these blocks."""
        missing: set[int] = set()
        for n in names:
            block = self.blocks.get(n)
            if block is not None:
                missing.update(block.barrier.waiting_for())
        return sorted(missing)

    def _maybe_finish_step(self, block: DenseBlock) -> None:
        if block.barrier.complete():
            # A complete step has arrivals, and push fills the accumulator before each arrival.
            assert block.acc is not None, f"block {block.name}: a step complete with no gradient summed"
            # The average folds into the update: no extra pass over the block.
            self._apply(block, block.acc, scale=1.0 / len(block.barrier.arrived))
            block.barrier.reset()

    def _apply(self, block: DenseBlock, grad: np.ndarray, scale: float = 1.0) -> None:
        block.rule.apply(block.values, grad, block.slots, block.version + 1, scale)
        block.version += 1

    @property
    def elements(self) -> int:
        return sum(b.values.size for b in self.blocks.values())
