"""Every setting paramshard reads, in one table: the contract (``ClusterEnv``) first, then
the variables read where they are used. ``ClusterEnv``, ``LaunchConfig``, the commands'
flags and docs/environment.md are generated from ``SETTINGS`` when their modules load.

Adding a setting: declare it in contract.py (every rank gets it as ``env.<field>``, the
launcher passes it on with LAUNCH, a flag with ``flags=``) or in process.py, then use it;
`paramshard env --markdown > docs/environment.md` and `python -m paramshard.settings.stubs`
(the type checker's view of the fields) regenerate what is written from the table.
"""
from __future__ import annotations

from paramshard.settings.contract import CONTRACT
from paramshard.settings.process_variables import PROCESS
from paramshard.settings.setting import JOB, Setting

SETTINGS: tuple[Setting, ...] = CONTRACT + PROCESS


def in_scope(scope: str) -> tuple[Setting, ...]:
    return tuple(s for s in SETTINGS if scope in s.scopes)


def contract() -> tuple[Setting, ...]:
    """The ClusterEnv fields, in order."""
    return in_scope(JOB)


def by_field(field: str) -> Setting:
    return next(s for s in SETTINGS if s.field == field)
