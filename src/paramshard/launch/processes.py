"""Child processes of a launcher: spawn with a tagged log pump, stop with escalation."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Sequence, TextIO

_print_lock = threading.Lock()


class Child:
    """One process whose merged stdout/stderr lines are printed as ``tag | line``."""

    def __init__(self, tag: str, argv: Sequence[str], env: dict, out: TextIO | None = None):
        self.tag, self.argv = tag, list(argv)
        self.out = out or sys.stdout
        # A session of its own: Ctrl-C reaches the launcher, which stops the
        # children in order, instead of every process dying half-way at once.
        self.proc = subprocess.Popen(self.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     text=True, errors="replace", bufsize=1)
        self._pump = threading.Thread(target=self._copy_lines, name=f"log-{tag}", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _copy_lines(self) -> None:
        for line in self.proc.stdout:
            with _print_lock:
                self.out.write(f"{self.tag} | {line}" if line.endswith("\n") else f"{self.tag} | {line}\n")
                self.out.flush()

    def poll(self) -> int | None:
        return self.proc.poll()

    def describe_exit(self) -> str:
        code = self.proc.returncode
        if code is None:
            return f"{self.tag} (pid {self.pid}) is still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"{self.tag} (pid {self.pid}) was killed by {name}"
        return f"{self.tag} (pid {self.pid}) exited with code {code}"

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the child's process group, then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(5)
        self._pump.join(timeout=2)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
