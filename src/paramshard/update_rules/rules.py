"""The update rules, in place on numpy arrays (servers and collective mode alike).

The formulas are torch.optim's (SGD, SGD with momentum, Adagrad, Adam) plus
FTRL-Proximal, so a model trained through the servers matches one trained with
torch.optim in one process; and row-wise Adagrad (FBGEMM's), for table rows only.
The same rule updates a dense block (``step`` an int) or a batch of sparse rows
gathered from a table (``step`` an array of per-row update counts, shape [rows, 1]).

Large dense blocks are updated in cache-sized chunks: every temporary a
formula needs is then small and stays in cache, so an update costs about one
pass over memory instead of one per arithmetic operation (measured: the SGD
step on a 16 MiB block went from 6.2 ms to under 2 ms).
"""
from __future__ import annotations

import numpy as np

from paramshard.errors import ConfigError
from paramshard.optim import FTRL, Adagrad, Adam, Momentum, OptimizerConfig, RowWiseAdagrad

CHUNK = 1 << 15   # elements: 128 KiB of float32 per operand


class Rule:
    """An update rule; each subclass names the config it takes (``config``): make_rule gives every
    rule the config of its own kind (RULES)."""
    slot_names: tuple[str, ...] = ()

    def __init__(self, config: OptimizerConfig):
        self.config = config

    @property
    def uses_step(self) -> bool:
        """Whether the update depends on how many updates came before."""
        return False

    def init_slots(self, shape, dtype=np.float32) -> list[np.ndarray]:
        return [np.zeros(shape, dtype) for _ in self.slot_names]

    def slot_widths(self, dim: int) -> tuple[int, ...]:
        """Columns of each state array per table row of width ``dim``: a slot of a batch of
        n rows is [n, width] (``dim`` for per-element rules, 1 for a per-row accumulator)."""
        return tuple(s.shape[1] for s in self.init_slots((0, dim)))

    def apply(self, param, grad, slots, step, scale: float = 1.0) -> None:
        """Update ``param`` in place with gradient ``scale * grad``.
        ``step`` counts updates including this one."""
        if param.ndim == 1 and param.size > CHUNK:
            for start in range(0, param.size, CHUNK):
                s = slice(start, start + CHUNK)
                self.update(param[s], grad[s], [x[s] for x in slots], step, scale)
        else:
            self.update(param, grad, slots, step, scale)

    def update(self, param, grad, slots, step, scale) -> None:
        raise NotImplementedError

    def _grad(self, param, grad, scale):
        """scale * grad (+ weight decay), as a new small array or the input itself."""
        if scale != 1.0:
            grad = grad * np.float32(scale)
        if self.config.weight_decay:
            grad = grad + np.float32(self.config.weight_decay) * param
        return grad


class SGDRule(Rule):
    def update(self, param, grad, slots, step, scale):
        if not self.config.weight_decay:
            param -= grad * np.float32(self.config.lr * scale)
        else:
            param -= np.float32(self.config.lr) * self._grad(param, grad, scale)


class MomentumRule(Rule):
    config: Momentum
    slot_names = ("momentum_buffer",)

    def update(self, param, grad, slots, step, scale):
        c = self.config
        g = self._grad(param, grad, scale)
        (buf,) = slots
        buf *= np.float32(c.momentum)   # zero-initialised buffer == torch's "buf = g" on step 1
        buf += g
        g = g + np.float32(c.momentum) * buf if c.nesterov else buf
        param -= np.float32(c.lr) * g


class AdagradRule(Rule):
    config: Adagrad
    slot_names = ("sum",)

    def init_slots(self, shape, dtype=np.float32):
        return [np.full(shape, self.config.initial_accumulator_value, dtype)]

    @property
    def uses_step(self) -> bool:
        return self.config.lr_decay != 0

    def update(self, param, grad, slots, step, scale):
        c = self.config
        g = self._grad(param, grad, scale)
        (acc,) = slots
        acc += g * g
        clr = (c.lr / (1 + (np.asarray(step, np.float64) - 1) * c.lr_decay)).astype(np.float32)
        param -= clr * g / (np.sqrt(acc) + np.float32(c.eps))


class AdamRule(Rule):
    config: Adam
    slot_names = ("exp_avg", "exp_avg_sq")
    uses_step = True

    def update(self, param, grad, slots, step, scale):
        c = self.config
        b1, b2 = c.betas
        g = self._grad(param, grad, scale)
        m, v = slots
        m *= np.float32(b1)
        m += np.float32(1 - b1) * g
        v *= np.float32(b2)
        v += np.float32(1 - b2) * (g * g)
        step = np.asarray(step, np.float64)
        bias1 = 1 - b1 ** step
        bias2_sqrt = np.sqrt(1 - b2 ** step)
        denom = np.sqrt(v) / bias2_sqrt.astype(np.float32) + np.float32(c.eps)
        param -= (c.lr / bias1).astype(np.float32) * m / denom


class FTRLRule(Rule):
    """Per-coordinate FTRL-Proximal; ``param`` is recomputed from (z, n)."""
    config: FTRL
    slot_names = ("z", "n")

    def update(self, param, grad, slots, step, scale):
        c = self.config
        g = self._grad(param, grad, scale) if scale != 1.0 else grad
        z, n = slots
        n_new = n + g * g
        sigma = (np.sqrt(n_new) - np.sqrt(n)) / np.float32(c.lr)
        z += g - sigma * param
        n[...] = n_new
        denom = (np.float32(c.beta) + np.sqrt(n)) / np.float32(c.lr) + np.float32(c.l2)
        shrunk = -(z - np.sign(z) * np.float32(c.l1)) / denom
        param[...] = np.where(np.abs(z) <= c.l1, 0.0, shrunk)


class RowWiseAdagradRule(Rule):
    """Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD): one accumulator per table row.

    Rows only: ``param`` and ``grad`` are float32 [n, dim], the one slot ("sum") is float32
    [n, 1]; a dense (1-D) parameter is refused. ``step`` is not read.

    The float32 arithmetic, exactly (a compiled store must reproduce it bit for bit). All
    arithmetic is IEEE float32 with round-to-nearest-even: no float64 intermediates, no fused
    multiply-add, no reassociation. lr, eps, weight_decay, scale and initial_accumulator_value
    are rounded to float32 once, before use. Per row r, columns j = 0..dim-1:

        g[j]    = grad[r, j]                     (no multiplication when scale == 1.0)
        g[j]    = g[j] * scale                   (when scale != 1.0)
        g[j]    = g[j] + weight_decay * param[r, j]     (the product first; when weight_decay != 0)
        total   = g[0] * g[0]
        total   = total + g[j] * g[j]            for j = 1, 2, .., dim-1 in this order (left to right,
                                                 one accumulator, each square rounded before the add)
        acc[r]  = acc[r] + total / float32(dim)  (a division, not a multiplication by 1/dim)
        m       = lr / (sqrt(acc[r]) + eps)      (sqrt correctly rounded, as IEEE requires)
        param[r, j] = param[r, j] - m * g[j]     (the product rounded, then the subtraction)

    Subnormal numbers are kept (no flush to zero). The sum is a plain loop over the columns,
    not numpy's sum/mean: those add in that order only below 8 columns and switch to 8
    interleaved partial sums from 8 columns on (checked on numpy 2.4: different bits for a
    large share of random rows at dim 8, 9, 16). The step is written lr / denominator once
    per row, then multiplied by each g[j], as FBGEMM does; it equals
    lr * g / (sqrt(acc) + eps) up to rounding.
    """
    config: RowWiseAdagrad
    slot_names = ("sum",)

    def init_slots(self, shape, dtype=np.float32):
        if len(shape) != 2:
            raise ConfigError(f"RowWiseAdagrad keeps one accumulator per table row: it updates SparseEmbedding "
                              f"rows [n, dim], not a dense parameter of shape {tuple(shape)} (use Adagrad)")
        return [np.full((shape[0], 1), self.config.initial_accumulator_value, dtype)]

    def update(self, param, grad, slots, step, scale):
        if param.ndim != 2:
            raise ConfigError(f"RowWiseAdagrad updates table rows [n, dim], not a dense parameter of shape "
                              f"{param.shape} (use Adagrad)")
        c = self.config
        g = self._grad(param, grad, scale)
        (acc,) = slots
        squares = g * g
        total = squares[:, 0].copy()
        for j in range(1, squares.shape[1]):     # left to right, one float32 accumulator per row
            total += squares[:, j]
        acc += (total / np.float32(squares.shape[1]))[:, None]
        multiplier = np.float32(c.lr) / (np.sqrt(acc) + np.float32(c.eps))      # [n, 1]
        param -= multiplier * g


RULES = {"sgd": SGDRule, "momentum": MomentumRule, "adagrad": AdagradRule,
         "adam": AdamRule, "ftrl": FTRLRule, "rowwise_adagrad": RowWiseAdagradRule}


def make_rule(config: OptimizerConfig) -> Rule:
    return RULES[config.kind](config)
