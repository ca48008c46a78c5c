"""Dataclass fields generated from the table: ``ClusterEnv``'s (scope JOB), ``LaunchConfig``'s
and ``K8sJobSpec``'s (scopes LAUNCH, K8S), and the launcher's copy into a rank's contract.

``with_fields`` runs before ``dataclasses.dataclass`` sees the class: it appends one
annotation and default per setting to the class body, as if written there by hand.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from paramshard.settings import table
from paramshard.settings.setting import JOB, LAUNCH, Setting


def field_name(setting: Setting, scope: str) -> str:
    # LaunchConfig and K8sJobSpec name a setting alike (``trainers``, not ``num_trainers``), as
    # flags.spec_fields and k8s._settings_env read them.
    name = setting.field if scope == JOB else (setting.launch_field or setting.field)
    assert name is not None, f"{setting.env}: a setting of scope {scope} needs a field name"
    return name


def _default(setting: Setting, scope: str):
    if scope == LAUNCH and setting.launch_factory is not None:
        return dataclasses.field(default_factory=setting.launch_factory)
    if setting.hidden:
        return dataclasses.field(default=setting.default, repr=False)
    if setting.required and scope == JOB:
        return dataclasses.MISSING
    return setting.default


def with_fields(scope: str, skip: tuple[str, ...] = ()):
    """Class decorator: the fields of every setting in ``scope`` not already in the class body
    (nor in ``skip``), after the class's own, in the table's order."""
    def decorate(cls):
        annotations = cls.__dict__.get("__annotations__", {})
        cls.__annotations__ = annotations
        added = []
        for setting in table.in_scope(scope):
            name = field_name(setting, scope)
            if name in annotations or name in skip:
                continue
            annotations[name] = setting.annotation
            added.append((name, setting))
            default = _default(setting, scope)
            if default is not dataclasses.MISSING:
                setattr(cls, name, default)
        cls.__settings_fields__ = tuple(added)   # for the type checker's stub (settings/stubs.py)
        return cls
    return decorate


def validate(env: Any) -> None:
    """Each contract field checked (and normalized, e.g. the mode) by its own setting."""
    for setting in table.contract():
        name = field_name(setting, JOB)
        value = getattr(env, name)
        checked = setting.validate(value)
        if checked is not value:
            object.__setattr__(env, name, checked)


def read(environ) -> dict[str, Any]:
    """ClusterEnv's fields from an environment, each by its own setting."""
    return {field_name(s, JOB): s.read(environ) for s in table.contract()}


def to_environ(env: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for setting in table.contract():
        out.update(setting.environ(getattr(env, field_name(setting, JOB)), env))
    return out


def launched(config: Any) -> dict[str, Any]:
    """The ClusterEnv fields a LaunchConfig carries (base_env's copy, generated)."""
    return {field_name(s, JOB): getattr(config, field_name(s, LAUNCH))
            for s in table.in_scope(LAUNCH) if JOB in s.scopes}
