"""Column names in error messages: "did you mean" for a name that is not there.

A typo'd column (``--categorical moive_id``, a schema that says ``userid`` for a
file whose header says ``user_id``) should be answered with the near name, not
with the whole list to scan by eye.
"""
from __future__ import annotations

import difflib

# difflib's ratio: 0.6 is its default and catches one or two wrong letters in a short name;
# case is folded first, so `UserID` for `user_id` still finds it.
CUTOFF = 0.6


def close_names(name: str, known, n: int = 3) -> list[str]:
    """The known names nearest to ``name`` (best first), compared without case."""
    known = list(known)
    by_folded: dict[str, str] = {}
    for k in known:
        by_folded.setdefault(k.lower(), k)
    near = difflib.get_close_matches(name.lower(), list(by_folded), n=n, cutoff=CUTOFF)
    return [by_folded[k] for k in near]


def did_you_mean(name: str, known) -> str:
    """' (did you mean 'x'?)' or ' (did you mean 'x' or 'y'?)', or '' when nothing is near."""
    near = close_names(name, known)
    if not near:
        return ""
    return " (did you mean " + " or ".join(repr(k) for k in near) + "?)"

