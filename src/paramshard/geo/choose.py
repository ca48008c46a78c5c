"""Which GeoSchedule a GEO trainer follows: ``--geo-k K`` (FixedK) or ``--geo-k auto`` (AutoK).

The bound is ``--max-staleness`` (the most local steps a trainer trains between two sends);
unset, DEFAULT_BOUND, raised to a fixed K given over it (a hand-picked k is the user's bound).
"""
from __future__ import annotations

import importlib

from paramshard.env import ClusterEnv
from paramshard.geo.schedule import FixedK, GeoSchedule

DEFAULT_K = 10          # --geo-k unset: a send every 10 local steps
DEFAULT_BOUND = 1024    # --max-staleness unset (auto_k.py says the same): over PaddlePaddle's best reported k, 700


def schedule_for(env: ClusterEnv) -> GeoSchedule:
    """The schedule ``env`` asks for (env checked that k <= --max-staleness when both are given)."""
    bound = env.max_staleness
    if env.geo_k == "auto":
        # Imported only when asked for: auto_k.py is its own part (and may be absent).
        auto_k = importlib.import_module("paramshard.geo.auto_k")
        return auto_k.AutoK(bound=bound if bound is not None else DEFAULT_BOUND)
    if env.geo_k is None:
        return FixedK(DEFAULT_K if bound is None else min(DEFAULT_K, bound), bound=bound or DEFAULT_BOUND)
    k = int(env.geo_k)
    return FixedK(k, bound=max(k, DEFAULT_BOUND) if bound is None else bound)
