"""Which GeoSchedule a GEO trainer follows: ``--geo-k K`` (FixedK) or ``--geo-k auto`` (AutoK).

The bound is ``--max-staleness`` (the most local steps a trainer trains between two sends);
unset, DEFAULT_BOUND, raised to a fixed K given over it (a hand-picked k is the user's bound).
"""
from __future__ import annotations

from paramshard.env import ClusterEnv
from paramshard.geo.schedule import FixedK, GeoSchedule

DEFAULT_K = 10          # --geo-k unset: a send every 10 local steps
DEFAULT_BOUND = 1000    # --max-staleness unset: PaddlePaddle's best reported k is 700; auto-k stays under this


def schedule_for(env: ClusterEnv) -> GeoSchedule:
    """The schedule ``env`` asks for (env checked that k <= --max-staleness when both are given)."""
    k = DEFAULT_K if env.geo_k is None else env.geo_k
    if k == "auto":
        # Imported only when asked for: auto_k.py is its own part (and may be absent).
        from paramshard.geo.auto_k import AutoK
        return AutoK(bound=env.max_staleness if env.max_staleness is not None else DEFAULT_BOUND)
    if env.max_staleness is not None:
        return FixedK(min(k, env.max_staleness) if env.geo_k is None else k, bound=env.max_staleness)
    return FixedK(k, bound=max(k, DEFAULT_BOUND))
