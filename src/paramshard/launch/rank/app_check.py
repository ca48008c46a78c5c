"""A program's own check of its arguments, run by the launcher before any process starts.

A module run by ``paramshard launch -m MODULE ARGS`` (for a package, its ``__init__``) or a
script run by ``paramshard launch SCRIPT ARGS`` may define, at top level::

    def check_arguments(argv: list[str], files: bool = True) -> None:
        '''Raise ConfigError (or SystemExit, as argparse does) if ``argv`` will not run.'''

The launcher calls it with ARGS: a bad flag is refused in a second, once, exit code 2,
instead of by every trainer after the whole cluster started. ``files`` is False when the
ranks run on other hosts (``--hosts``): the files named in ARGS are there, not here, so only
the arguments themselves are checked. A ``--help`` among ARGS prints the program's help
once (its SystemExit(0) ends the launch).

Opting in has one condition: the file must be importable without running the program (its
work under ``if __name__ == "__main__":``), as the launcher imports it. So that a script
or module that never heard of this is never imported here, the file is read first and
imported only when it defines ``check_arguments``. A module that cannot be found here (it
lives on the hosts only) is not checked.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

from paramshard.errors import ConfigError

NAME = "check_arguments"
_DEFINES = re.compile(rb"^def\s+check_arguments\s*\(", re.MULTILINE)


@contextmanager
def _on_path(directory: str):
    # python -m puts the working directory first on sys.path, python SCRIPT the script's.
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        try:
            sys.path.remove(directory)
        except ValueError:
            pass


def _declares(path: str | None) -> bool:
    try:
        return path is not None and bool(_DEFINES.search(Path(path).read_bytes()))
    except OSError:
        return False


def _module_check(module: str, search: str) -> Callable | None:
    with _on_path(search):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):       # a parent package missing here: not checkable here
            return None
        if spec is None or not _declares(spec.origin):
            return None
        try:
            loaded = importlib.import_module(module)
        except Exception as exc:
            raise ConfigError(f"-m {module}: importing it to check its arguments failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    return getattr(loaded, NAME, None)


def _script_check(script: str) -> Callable | None:
    if not os.path.isfile(script) or not _declares(script):
        return None
    spec = importlib.util.spec_from_file_location("__paramshard_checked_script__", script)
    if spec is None or spec.loader is None:
        return None
    loaded = importlib.util.module_from_spec(spec)
    with _on_path(os.path.dirname(os.path.abspath(script))):
        try:
            spec.loader.exec_module(loaded)
        except Exception as exc:
            raise ConfigError(f"{script}: importing it to check its arguments failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    return getattr(loaded, NAME, None)


def find_check(script: str | None, module: str | None, search: str | None = None) -> Callable | None:
    """The program's ``check_arguments``, or None when it has none (or is not here to read).
    ``search``: where a module is looked for first (default: the working directory)."""
    if module is not None:
        return _module_check(module, search or os.getcwd())
    if script is not None:
        return _script_check(script)
    return None


def check_arguments(script: str | None, module: str | None, argv: Sequence[str], files: bool = True,
                    search: str | None = None) -> None:
    """Run the program's check on ``argv``; a refusal is a ConfigError naming the program
    (SystemExit, e.g. argparse's own error or --help, passes through)."""
    check = find_check(script, module, search)
    if check is None:
        return
    what = f"-m {module}" if module is not None else script
    try:
        check(list(argv), files=files)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
