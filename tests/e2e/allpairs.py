"""All-pairs (pairwise) covering of a set of factors: few cases such that every allowed pair of
values of any two factors appears in at least one case.

Greedy over the whole product (small here: a few thousand combinations): each new case is the
allowed combination that covers the most pairs not yet covered, ties broken by the product's
order, so the covering is deterministic. ``allowed(case)`` rules out combinations that cannot
run (they are tested as refusals elsewhere); a pair that no allowed case holds is not required.
"""
from __future__ import annotations

import itertools
from typing import Callable, Mapping, Sequence


def pairs_of(case: Mapping[str, object], names: Sequence[str]) -> set:
    return {((a, case[a]), (b, case[b])) for a, b in itertools.combinations(names, 2)}


def all_pairs(factors: Mapping[str, Sequence], allowed: Callable[[dict], bool] = lambda case: True) -> list[dict]:
    names = list(factors)
    candidates = [case for case in (dict(zip(names, values)) for values in itertools.product(*factors.values()))
                  if allowed(case)]
    needed = set().union(*(pairs_of(case, names) for case in candidates)) if candidates else set()
    cases: list[dict] = []
    while needed:
        best = max(candidates, key=lambda case: len(pairs_of(case, names) & needed))
        cases.append(best)
        needed -= pairs_of(best, names)
    return cases
