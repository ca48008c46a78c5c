"""The commands' flags generated from the table, and the flags' values handed back by setting.

A setting declares its flag per command (``Setting.flags``); `paramshard launch`, `run` and
`k8s` call ``add_flags`` and read the values back with ``launch_fields`` / ``contract_changes``
/ ``spec_fields``, so a new flag needs no edit in the command's module.
"""
from __future__ import annotations

import argparse
from typing import Any

from paramshard.settings import table
from paramshard.settings.fields import field_name
from paramshard.settings.setting import JOB, K8S, LAUNCH


def add_flags(parser: argparse.ArgumentParser, command: str, groups: dict | None = None) -> dict:
    """Add ``command``'s flags, in the table's order; a flag with a group goes into ``groups``'
    container of that title, made on first use. Returns the groups (the command adds its own
    flags to them)."""
    groups = {} if groups is None else groups
    for setting in table.SETTINGS:
        flag = setting.flag_for(command)
        if flag is None:
            continue
        where = parser
        if flag.group is not None:
            if flag.group not in groups:
                groups[flag.group] = parser.add_argument_group(flag.group)
            where = groups[flag.group]
        where.add_argument(flag.name, help=flag.help, **flag.options)
    return groups


def _given(args: argparse.Namespace, setting, command: str) -> Any:
    flag = setting.flag_for(command)
    return None if flag is None else getattr(args, flag.dest, None)


def launch_fields(args: argparse.Namespace, command: str, outer: Any) -> dict[str, Any]:
    """LaunchConfig's settings: each flag's value; where there is none (unset, off) and the
    setting is inherited (security, limits), the value in the launcher's own environment
    ``outer`` (a ClusterEnv). Settings with neither keep LaunchConfig's default."""
    out = {}
    for setting in table.in_scope(LAUNCH):
        value = _given(args, setting, command)
        if (value is None or value is False) and setting.inherit:
            value = getattr(outer, field_name(setting, JOB))
        if value is None or value == "":
            continue
        out[field_name(setting, LAUNCH)] = value
    return out


def contract_changes(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The ClusterEnv fields the command's flags set (a flag not given changes nothing)."""
    out = {}
    for setting in table.in_scope(JOB):
        value = _given(args, setting, command)
        if value is not None and value is not False:
            out[field_name(setting, JOB)] = value
    return out


def spec_fields(args: argparse.Namespace) -> dict[str, Any]:
    """K8sJobSpec's settings from `paramshard k8s`'s flags."""
    out = {}
    for setting in table.in_scope(K8S):
        value = _given(args, setting, "k8s")
        if value is not None:
            out[field_name(setting, K8S)] = value
    return out
