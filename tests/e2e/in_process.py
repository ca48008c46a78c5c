"""A `paramshard` command run in this process, for the checks that refuse a command line before
it has any effect: the same parser, checks and message as the real command, without the 1-2 s
of CPU it takes to start Python and torch in a child process. Each refusal path keeps one test
that runs the real command in a child process (exit code and message reach the user)."""
from __future__ import annotations

from paramshard.cli.main import main


def cli_in_process(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `paramshard ARGV` run by this process's own ``main``."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:          # argparse's errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err
