"""What the fork server's tests share (test_fork_server.py, test_zygote_host.py): a rank's
script written to a file, and a wait for a process to be gone."""
from __future__ import annotations

import os
import textwrap
import time


def rank_script(tmp_path, text: str, name: str = "rank.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` no longer exists within ``timeout`` s (a zombie still does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False
