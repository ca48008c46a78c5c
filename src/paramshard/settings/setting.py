"""One setting, declared once: its variable, how it is read and written, where it applies.

A ``Setting`` is pure data plus the few rules every setting shares, so that the
environment contract (``ClusterEnv``), the launcher's ``LaunchConfig``, the CLI
flags and docs/environment.md are all generated from the one table
(settings/table.py) instead of being copied by hand.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from paramshard.errors import ConfigError

# Where a setting applies (``Setting.scopes``):
JOB = "job"          # a field of every rank's contract, ClusterEnv (read from and written to the environment)
LAUNCH = "launch"    # a field of LaunchConfig too, copied into every rank's ClusterEnv (``base_env``)
K8S = "k8s"          # a field of K8sJobSpec too, written into every pod's environment
# Settings without JOB are read where they are used, through ``Setting.read`` (the cache, the
# log level, Slurm's store port ...): declared here all the same, so the docs list every one.


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command's flag for a setting; ``options`` are add_argument's keyword arguments."""
    command: str                     # "launch", "run" or "k8s": the parser that gets it
    name: str                        # "--timeout"
    help: str
    group: str | None = None         # an argument group's title (made on first use, or given by the command)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.options.get("dest") or self.name.lstrip("-").replace("-", "_")


def flag(command: str, name: str, help: str, group: str | None = None, **options) -> Flag:
    return Flag(command, name, help, group, options)


def _never(_value) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Setting:
    env: str                                  # the variable
    help: str                                 # its meaning, for docs/environment.md
    field: str | None = None                  # its name in ClusterEnv / LaunchConfig / K8sJobSpec
    default: Any = None
    annotation: str = "str | None"            # the field's type, as written in a class body
    parse: Callable[[str], Any] = str         # text -> value; a ValueError is reported with `invalid`
    invalid: str = " is not a whole number"
    keep_empty: bool = False                  # an empty variable is a value (parsed), not "unset"
    fallbacks: tuple[str, ...] = ()           # read when ``env`` is unset (PaddlePaddle's names); docs too
    reader: Callable[[Mapping[str, str]], Any] | None = None   # reads the whole environment instead
    check: Callable[[Any], str | None] = _never                # the error message for a bad value
    coerce: Callable[[Any], Any] | None = None                 # normalizes a value given in Python
    text: Callable[[Any], str] = str          # value -> the variable's text
    always: bool = False                      # written even at its default
    written_when: Callable[[Any], bool] | None = None          # ClusterEnv -> write it? (instead of the default rule)
    writer: Callable[[Any], dict[str, str]] | None = None      # writes several variables (limits)
    scopes: frozenset[str] = frozenset({JOB})
    launch_field: str | None = None           # LaunchConfig's name for it, when not ``field``
    launch_factory: Callable[[], Any] | None = None            # LaunchConfig's default, when not ``default``
    inherit: bool = False                     # `paramshard launch` passes its own environment's value on
    flags: tuple[Flag, ...] = ()
    hidden: bool = False                      # kept out of repr (a secret: never in a log line or traceback)
    required: bool = False                    # no default: ClusterEnv(role=...) is always explicit
    doc_rows: Callable[[], list[tuple[str, str, str]]] | None = None   # several rows (limits)

    # -- reading -----------------------------------------------------------------
    def found(self, environ: Mapping[str, str]) -> tuple[str, str] | None:
        """(variable, text) of the first of ``env`` and its fallbacks that is set."""
        if self.keep_empty:
            return (self.env, environ[self.env]) if self.env in environ else None
        for name in (self.env, *self.fallbacks):
            if environ.get(name, "") != "":
                return name, environ[name]
        return None

    def read(self, environ: Mapping[str, str]) -> Any:
        """The value in ``environ`` (default when unset); ConfigError naming the variable."""
        if self.reader is not None:
            return self.reader(environ)
        hit = self.found(environ)
        if hit is None:
            return self.default
        try:
            return self.parse(hit[1])
        except ValueError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{hit[0]}={hit[1]!r}{self.invalid}") from None

    # -- checking and writing ----------------------------------------------------
    def validate(self, value: Any) -> Any:
        """The value normalized (``coerce``); ConfigError with ``check``'s message when it is bad."""
        if self.coerce is not None:
            value = self.coerce(value)
        problem = self.check(value)
        if problem:
            raise ConfigError(problem)
        return value

    def environ(self, value: Any, env: Any) -> dict[str, str]:
        """The variables that carry ``value`` (of the ClusterEnv ``env``) to a rank. By default
        a value at its default, empty or False is left out: the reader gives the default back."""
        if self.writer is not None:
            return self.writer(value)
        if self.written_when is not None:
            wanted = self.written_when(env)
        else:
            wanted = self.always or not (value == self.default or value is False or value == "")
        return {self.env: self.text(value)} if wanted else {}

    # -- where it applies --------------------------------------------------------
    @property
    def in_launch(self) -> bool:
        return LAUNCH in self.scopes

    @property
    def launch_name(self) -> str | None:
        return (self.launch_field or self.field) if self.in_launch else None

    def flag_for(self, command: str) -> Flag | None:
        return next((f for f in self.flags if f.command == command), None)

    def rows(self) -> list[tuple[str, str, str]]:
        """(variable, meaning, flags) rows of docs/environment.md."""
        if self.doc_rows is not None:
            return self.doc_rows()
        flags = ", ".join(f"`{f.command} {f.name}`" for f in self.flags)
        return [(self.env, self.help, flags)]
