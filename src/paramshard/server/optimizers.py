"""Server-side update rules, in place on numpy arrays.

The formulas are torch.optim's (SGD, SGD with momentum, Adagrad, Adam) plus
FTRL-Proximal, so a model trained through the servers matches one trained with
torch.optim in one process. The same rule updates a dense block (``step`` an
int) or a batch of sparse rows gathered from a table (``step`` an array of
per-row update counts, shape [rows, 1]).
"""
from __future__ import annotations

import numpy as np

from ..optim import OptimizerConfig


class Rule:
    slot_names: tuple[str, ...] = ()

    def __init__(self, config: OptimizerConfig):
        self.config = config

    def init_slots(self, shape, dtype=np.float32) -> list[np.ndarray]:
        return [np.zeros(shape, dtype) for _ in self.slot_names]

    def apply(self, param, grad, slots, step, scratch=None) -> None:
        """Update ``param`` in place. ``step`` counts updates including this one."""
        raise NotImplementedError

    def _grad_with_decay(self, param, grad, scratch):
        wd = self.config.weight_decay
        if not wd:
            return grad
        out = scratch if scratch is not None else np.empty_like(grad)
        np.multiply(param, wd, out=out)
        out += grad
        return out


class SGDRule(Rule):
    def apply(self, param, grad, slots, step, scratch=None):
        g = self._grad_with_decay(param, grad, scratch)
        out = scratch if scratch is not None else np.empty_like(g)
        np.multiply(g, self.config.lr, out=out)   # fine when g is out
        param -= out


class MomentumRule(Rule):
    slot_names = ("momentum_buffer",)

    def apply(self, param, grad, slots, step, scratch=None):
        c = self.config
        g = self._grad_with_decay(param, grad, scratch)
        (buf,) = slots
        buf *= c.momentum          # zero-initialised buffer == torch's "buf = g" on step 1
        buf += g
        if c.nesterov:
            g = g + c.momentum * buf
        else:
            g = buf
        param -= c.lr * g


class AdagradRule(Rule):
    slot_names = ("sum",)

    def init_slots(self, shape, dtype=np.float32):
        return [np.full(shape, self.config.initial_accumulator_value, dtype)]

    def apply(self, param, grad, slots, step, scratch=None):
        c = self.config
        g = self._grad_with_decay(param, grad, scratch)
        (acc,) = slots
        acc += g * g
        clr = c.lr / (1 + (np.asarray(step, np.float32) - 1) * c.lr_decay)
        param -= clr * g / (np.sqrt(acc) + c.eps)


class AdamRule(Rule):
    slot_names = ("exp_avg", "exp_avg_sq")

    def apply(self, param, grad, slots, step, scratch=None):
        c = self.config
        b1, b2 = c.betas
        g = self._grad_with_decay(param, grad, scratch)
        m, v = slots
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        step = np.asarray(step, np.float64)
        bias1 = 1 - b1 ** step
        bias2_sqrt = np.sqrt(1 - b2 ** step)
        denom = np.sqrt(v) / bias2_sqrt.astype(np.float32) + np.float32(c.eps)
        param -= (c.lr / bias1).astype(np.float32) * m / denom


class FTRLRule(Rule):
    """Per-coordinate FTRL-Proximal; ``param`` is recomputed from (z, n)."""
    slot_names = ("z", "n")

    def apply(self, param, grad, slots, step, scratch=None):
        c = self.config
        z, n = slots
        n_new = n + grad * grad
        sigma = (np.sqrt(n_new) - np.sqrt(n)) / c.lr
        z += grad - sigma * param
        n[...] = n_new
        denom = (c.beta + np.sqrt(n)) / c.lr + c.l2
        shrunk = -(z - np.sign(z) * c.l1) / denom
        param[...] = np.where(np.abs(z) <= c.l1, 0.0, shrunk)


RULES = {"sgd": SGDRule, "momentum": MomentumRule, "adagrad": AdagradRule,
         "adam": AdamRule, "ftrl": FTRLRule}


def make_rule(config: OptimizerConfig) -> Rule:
    return RULES[config.kind](config)
