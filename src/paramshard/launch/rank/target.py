"""What a trainer runs: a script file, or a module the way ``python -m`` runs it.

`paramshard launch`, `run` and `k8s` all take ``SCRIPT [ARGS]`` or
``-m MODULE [ARGS]``, as python and torchrun do: every word after the script
or the module name is its own, option-like words included.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, Sequence

from paramshard.errors import ConfigError

MODULE_HELP = ("run the trainers as `python -m MODULE ARGS` instead of a script; every word after MODULE "
               "is its own. The module must be importable where the trainers run (their working "
               "directory is on sys.path, as with python -m)")


def check(script: str | None, module: str | None) -> None:
    """Exactly one of a script and a module, and a module name python -m can take."""
    if script is None and module is None:
        raise ConfigError("nothing to run: give a training script (SCRIPT [ARGS]) or a module (-m MODULE [ARGS])")
    if script is not None and module is not None:
        raise ConfigError(f"both a script ({script!r}) and -m {module}: give one of them; the module's own "
                          f"arguments go after its name (-m {module} ARGS)")
    if module is None:
        return
    # A path is never a module name; `train.py` is one in form (module py of package train),
    # but when such a file is here the user meant the file.
    if not all(part.isidentifier() for part in module.split(".")) or os.path.isfile(module):
        hint = "; to run a file, give its path without -m" if module.endswith(".py") or os.sep in module else ""
        raise ConfigError(f"-m {module!r}: not a module name (dotted Python names, e.g. mypkg.train){hint}")


def module_hint(script: str) -> str:
    """For a script that is not there: "; to run the module ..., give -m NAME" when the name
    reads as a dotted module name (`paramshard launch ... paramshard.apps.ctr`, -m forgotten)."""
    parts = script.split(".")
    if os.sep in script or script.endswith(".py") or not all(part.isidentifier() for part in parts):
        return ""
    return f"; to run the module {script}, give -m {script} (as python -m runs it)"


def command_words(script: str | None, module: str | None, args: Sequence[str]) -> list[str]:
    """What follows the interpreter: ``SCRIPT ARGS`` or ``-m MODULE ARGS``."""
    if module is not None:
        return ["-m", module, *args]
    assert script is not None, "a target is a script or a module (check() said which)"
    return [script, *args]


def add_module_argument(p: argparse.ArgumentParser) -> None:
    # REMAINDER: -m takes every word after it, so `-m pkg.train --epochs 3` leaves --epochs
    # to the module instead of argparse reading it as one of our flags.
    p.add_argument("-m", "--module", nargs=argparse.REMAINDER, help=f"MODULE [ARGS]: {MODULE_HELP}")


def no_abbreviations(p: argparse.ArgumentParser) -> None:
    # argparse reads every word as a possible abbreviation of our flags, even after the script:
    # a script's --train would be "ambiguous: --trainers, --trainer-hosts" and the launch refused.
    p.allow_abbrev = False


def from_args(script: str | None, module_words: list[str] | None,
              script_args: Sequence[str]) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(script, module, its arguments) from the parsed positional script and -m's words."""
    if module_words is None:
        check(script, None)
        return script, None, tuple(script_args)
    if not module_words:
        raise ConfigError("-m needs a module name: -m MODULE [ARGS], e.g. -m mypkg.train --epochs 3")
    module, *args = module_words
    check(script, module)
    return None, module, tuple(args)


def split_attached_module(argv: Sequence[str], add_arguments: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """``-mpkg.train`` and ``--module=pkg.train`` as two words: attached, argparse gives -m only
    that word and reads the module's arguments as our own flags. Only among our flags:
    from the script on, every word is the script's (an -mX of its own included), so the
    walk needs to know which of our flags take a value (``add_arguments`` declares them)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    nargs = {flag: action.nargs for action in parser._actions for flag in action.option_strings}
    nargs.update({"-h": 0, "--help": 0})
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("--module="):
            return [*argv[:i], "-m", word.partition("=")[2], *argv[i + 1:]]
        if word.startswith("-m") and len(word) > 2 and not word.startswith("--"):
            return [*argv[:i], "-m", word[2:], *argv[i + 1:]]
        if word in ("-m", "--module", "--") or not word.startswith("-"):
            return argv          # -m already apart, or the script: nothing more of ours
        follows_value = i + 1 < len(argv) and not argv[i + 1].startswith("-")
        kind = nargs.get(word, None)     # not ours: argparse refuses it anyway (no abbreviations)
        takes_value = "=" not in word and (kind is None or kind == 1 or (kind == "?" and follows_value))
        i += 2 if takes_value else 1
    return argv
