"""DeepFM (Guo et al. 2017, "DeepFM: A Factorization-Machine based Neural Network for CTR Prediction")."""
from __future__ import annotations

import torch

from paramshard.models.wide_deep import WideDeep


def fm_interaction(v: torch.Tensor) -> torch.Tensor:
    """[B, F, k] -> [B]: sum over field pairs i < j of <v_i, v_j>, in O(F k) as
    0.5 * sum_k((sum_f v_fk)^2 - sum_f v_fk^2)."""
    return 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)


class DeepFM(WideDeep):
    """logit = first order (logistic regression: "wide" table + dense linear) + FM second
    order over the F field embeddings + MLP(concat(the same embeddings, dense)) -> 1.
    The FM and the MLP share the "deep" table, as in the paper: WideDeep plus the FM term."""

    def interaction(self, v: torch.Tensor) -> torch.Tensor:
        return fm_interaction(v)
