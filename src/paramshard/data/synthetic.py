"""Synthetic Criteo-like data with a known answer.

Rows are drawn from a hidden logistic model, so the best AUC any model can
reach on them (the AUC of the hidden model's own probabilities) is known and
reported: tests and examples compare what they learn with that ceiling.

The hidden model, all from ``seed``:
- categorical field f has ``vocab_sizes[f]`` values; a row picks rank r with
  P(r) proportional to (r+1)**-zipf_a (a few values are very common, most are
  rare, as in real CTR logs), or is missing with ``SPARSE_MISSING[f]``;
  rank r is written as the 8-hex-digit value mix32(r) (a bijection, so values
  of one field never collide);
- every (field, value) and every field's "missing" has a weight ~ N(0, 1);
- the 13 integer columns are log-normal counts (some missing) and add a small
  linear part on log1p(count), the reader's transform;
- the sparse and dense parts are scaled so their standard deviations are
  ``logit_std * sqrt(1 - DENSE_SHARE**2)`` and ``logit_std * DENSE_SHARE``, and
  a bias is solved for so the mean click probability is ``click_rate``.
  logit_std=1.4 puts the hidden model's AUC near 0.80 (1.2 -> 0.78, 1.6 -> 0.83).

The output depends only on (seed, rows, model parameters): rows are made in
fixed blocks of BLOCK_ROWS, each with its own random stream, so the first k
rows of a bigger file equal a k-row file, and memory stays O(BLOCK_ROWS).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paramshard.errors import ConfigError
from paramshard.data.readers.criteo import MISSING, NUM_DENSE, NUM_SPARSE, CriteoBatch, dense_transform
from paramshard.data.metrics import StreamingAUC

# Shaped like Criteo's fields (a few tiny, most 10^3-10^5) but small enough to learn from 10^5 rows.
DEFAULT_VOCAB_SIZES = (1000, 500, 50000, 20000, 300, 20, 10000, 600, 3, 30000, 5000, 50000, 3000,
                       25, 10000, 40000, 10, 4000, 2000, 4, 40000, 15, 15, 30000, 80, 20000)
SPARSE_MISSING = (0, 0, .03, .03, 0, .1, 0, 0, 0, .03, 0, .03, 0,
                  0, 0, .03, 0, 0, .4, .4, .03, 0, .7, 0.03, .4, .4)
DENSE_MISSING = (.4, 0, .2, .2, .02, .2, .04, 0, .04, .4, .04, .75, .2)
DENSE_SHARE = 0.3
BLOCK_ROWS = 1 << 15
_CALIBRATION_ROWS = 1 << 15
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def mix32(x: np.ndarray, salt: int) -> np.ndarray:
    """A bijection of 32-bit integers (the 'lowbias32' hash) keyed by salt."""
    m = np.uint64(0xFFFFFFFF)
    x = (x.astype(np.uint64) + np.uint64(salt & 0xFFFFFFFF)) & m
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & m
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & m
    x ^= x >> np.uint64(16)
    return x


def _salt(seed: int, field: int) -> int:
    # the odd offset keeps rank 0 away from mix32's fixed point 0 -> 0
    return seed * 977 + field * 0x9E3779B9 + 0x5BD1E995


@dataclass(frozen=True)
class GenerateReport:
    path: Path
    rows: int
    clicks: int
    click_rate: float
    hidden_auc: float      # AUC of the hidden model's probabilities: the ceiling for any model
    hidden_logloss: float  # likewise the floor of the log loss


class HiddenModel:
    """The logistic model the labels are drawn from (see the module docstring)."""

    def __init__(self, seed: int = 0, vocab_sizes=DEFAULT_VOCAB_SIZES, zipf_a: float = 1.2,
                 click_rate: float = 0.25, logit_std: float = 1.4):
        if len(vocab_sizes) != NUM_SPARSE or min(vocab_sizes) < 1:
            raise ConfigError(f"vocab_sizes needs {NUM_SPARSE} sizes >= 1, got {vocab_sizes!r}")
        if not 0 < click_rate < 1 or zipf_a <= 0 or logit_std < 0 or seed < 0:
            raise ConfigError("need 0 < click_rate < 1, zipf_a > 0, logit_std >= 0 and seed >= 0")
        self.seed = seed
        rng = np.random.default_rng([seed, 0])
        self.cdfs = []
        self.values = []    # per field: rank -> 32-bit value written to the file
        self.weights = []   # per field: rank -> weight; index vocab_size = missing
        for f, v in enumerate(vocab_sizes):
            p = np.arange(1, v + 1, dtype=np.float64) ** -zipf_a
            self.cdfs.append(np.cumsum(p) / p.sum())
            vals = mix32(np.arange(v), salt=_salt(seed, f))
            # the one rank mix32 may send to the "missing" value takes rank v's image instead
            vals[vals == MISSING] = mix32(np.array([v]), salt=_salt(seed, f))
            self.values.append(vals)
            self.weights.append(rng.standard_normal(v + 1))
        self.dense_mu = rng.uniform(0.0, 4.0, NUM_DENSE)
        self.dense_sigma = rng.uniform(0.5, 2.0, NUM_DENSE)
        self.dense_weights = rng.standard_normal(NUM_DENSE)
        self.bias = 0.0
        # Scale both parts, then solve for the bias, on a calibration sample.
        ranks, counts = self._draw(np.random.default_rng([seed, 1]), _CALIBRATION_ROWS)
        zs, zd = self._sparse_logit(ranks), dense_transform(counts) @ self.dense_weights
        s_scale = logit_std * np.sqrt(1 - DENSE_SHARE**2) / max(zs.std(), 1e-12)
        d_scale = logit_std * DENSE_SHARE / max(zd.std(), 1e-12)
        self.weights = [w * s_scale for w in self.weights]
        self.dense_weights = self.dense_weights * d_scale
        z = zs * s_scale + zd * d_scale
        lo, hi = -30.0, 30.0
        for _ in range(100):  # mean sigmoid is increasing in the bias: bisect
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _sigmoid(z + mid).mean() < click_rate else (lo, mid)
        self.bias = (lo + hi) / 2
        # id lookup for probabilities(): sorted values per field
        self._order = [np.argsort(v) for v in self.values]
        self._sorted = [v[o] for v, o in zip(self.values, self._order)]

    def _draw(self, rng, n):
        """n rows of (ranks int64[n,26] with vocab_size = missing, raw counts int64[n,13] with missing = 0)."""
        ranks = np.empty((n, NUM_SPARSE), np.int64)
        for f, cdf in enumerate(self.cdfs):
            r = np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)
            ranks[:, f] = np.where(rng.random(n) < SPARSE_MISSING[f], len(cdf), r)
        counts = np.floor(np.exp(rng.normal(self.dense_mu, self.dense_sigma, (n, NUM_DENSE))))
        counts = np.minimum(counts, 1e9).astype(np.int64)
        dense_missing = rng.random((n, NUM_DENSE)) < np.array(DENSE_MISSING)
        counts[dense_missing] = -1  # marker, written as an empty field; reads back as 0
        return ranks, counts

    def _sparse_logit(self, ranks):
        return sum(w[ranks[:, f]] for f, w in enumerate(self.weights))

    def _logit(self, ranks, counts):
        return self._sparse_logit(ranks) + dense_transform(counts) @ self.dense_weights + self.bias

    def probabilities(self, batch: CriteoBatch) -> np.ndarray:
        """The hidden model's click probabilities for rows as CriteoReader yields them.
        Ids the model never produces get weight 0."""
        z = batch.dense.astype(np.float64) @ self.dense_weights + self.bias
        for f in range(NUM_SPARSE):
            ids = batch.sparse_ids[:, f]
            value = ids & np.uint64(MISSING)
            pos = np.minimum(np.searchsorted(self._sorted[f], value), len(self._sorted[f]) - 1)
            known = (self._sorted[f][pos] == value) & ((ids >> np.uint64(32)) == f)
            rank = np.where(value == MISSING, len(self.values[f]), self._order[f][pos])
            z += np.where(known | (value == MISSING), self.weights[f][rank], 0.0)
        return _sigmoid(z)

    def sample_block(self, block: int, n: int = BLOCK_ROWS):
        """The first n rows of block number ``block``: (labels int8[n], probabilities, ranks, counts).
        A full block is always drawn, so a row never depends on how many follow it."""
        rng = np.random.default_rng([self.seed, 2, block])
        ranks, counts = self._draw(rng, BLOCK_ROWS)
        prob = _sigmoid(self._logit(ranks, counts))
        labels = (rng.random(BLOCK_ROWS) < prob).astype(np.int8)
        return labels[:n], prob[:n], ranks[:n], counts[:n]

    def format_rows(self, labels, ranks, counts) -> bytes:
        """Criteo TSV text of the rows (vectorised per column, joined per row in C)."""
        cols = [np.where(labels == 1, b"1", b"0").tolist()]
        for j in range(NUM_DENSE):
            text = counts[:, j].astype("S20")
            cols.append(np.where(counts[:, j] < 0, b"", text).tolist())
        shifts = np.arange(28, -1, -4, dtype=np.uint64)
        for f in range(NUM_SPARSE):
            missing = ranks[:, f] == len(self.values[f])
            vals = self.values[f][np.minimum(ranks[:, f], len(self.values[f]) - 1)]
            digits = _HEX[((vals[:, None] >> shifts) & np.uint64(15)).astype(np.intp)]
            text = np.ascontiguousarray(digits).view("S8").ravel()
            cols.append(np.where(missing, b"", text).tolist())
        return b"".join(line + b"\n" for line in map(b"\t".join, zip(*cols)))


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def generate_criteo(path, rows: int, seed: int = 0, vocab_sizes=DEFAULT_VOCAB_SIZES,
                    zipf_a: float = 1.2, click_rate: float = 0.25,
                    logit_std: float = 1.4) -> GenerateReport:
    """Write ``rows`` rows of Criteo TSV to ``path`` and report the hidden model's
    click rate, AUC and log loss on exactly those rows."""
    if rows < 0:
        raise ConfigError(f"rows={rows}: must be >= 0")
    model = HiddenModel(seed, vocab_sizes, zipf_a, click_rate, logit_std)
    path = Path(path)
    meter = StreamingAUC()
    clicks, loss = 0, 0.0
    with open(path, "wb") as out:
        for block, start in enumerate(range(0, rows, BLOCK_ROWS)):
            labels, prob, ranks, counts = model.sample_block(block, min(BLOCK_ROWS, rows - start))
            out.write(model.format_rows(labels, ranks, counts))
            meter.update(labels, prob)
            clicks += int(labels.sum())
            p = np.clip(prob, 1e-15, 1 - 1e-15)
            loss -= float(np.where(labels == 1, np.log(p), np.log1p(-p)).sum())
    return GenerateReport(path, rows, clicks, clicks / rows if rows else float("nan"),
                          meter.value(), loss / rows if rows else float("nan"))
