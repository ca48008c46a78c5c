"""Where a server's disk tier keeps its files (server/storage/tiered_row_store.py).

``<run dir>/tier/server-<id>/<table>/`` when the server writes a run directory
(``paramshard run --run-dir``: PARAMSHARD_RECORDS=dir:PATH), else the same under
the checkpoint directory (a local one), else a private temporary directory
(mode 0700, made by mkdtemp in TMPDIR). Every directory of the tier is made here with
mode 0700 and a directory that must be new is made exclusively; an existing ``tier/`` is used
only when it is a real directory of this user that nobody else may write into (``private``):
another local user must not be able to plant, swap or read a server's rows.
The files are scratch: they are removed with their table, and the whole
directory when the server exits; one left by a killed server is removed when a
server with the same id starts in the same place (temporary ones: when any
server of the same user starts and their process is gone). Their disk is
reserved before rows are written (tier_space.py).

Table names come from trainers: a name that is not a plain file name component
(checkpoint/paths.py's rule) is replaced by a hash of it, so no name reaches
outside the directory.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from paramshard.errors import ConfigError
from paramshard.log import get_logger

log = get_logger("tier")
TEMP_PREFIX = "paramshard-tier-"
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")     # checkpoint/paths.py's, and short


class TierDirError(ConfigError):
    """A tier directory that is not private to this user: refused, never written into."""


def check_private(path: Path) -> None:
    """Refuse ``path`` unless it is a directory (not a symbolic link) owned by this user that
    neither its group nor others may write into."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise TierDirError(f"disk tier directory {path}: {exc.strerror or exc}") from exc
    fix = "remove it, or give the servers another --checkpoint-dir / --run-dir"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise TierDirError(f"disk tier directory {path} is {what}; the tier keeps its files only in a "
                           f"directory of its own: {fix}")
    if st.st_uid != os.getuid():
        raise TierDirError(f"disk tier directory {path} belongs to uid {st.st_uid}, not to this user (uid "
                           f"{os.getuid()}); another user could read or change the rows in it: {fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TierDirError(f"disk tier directory {path} is writable by its group or by others (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); another user could replace the files in it: "
                           f"chmod go-w {path}, or {fix}")


def private(path: Path, exclusive: bool) -> Path:
    """Directory ``path`` made with mode 0700 (its parent must exist); if it exists: refused when
    ``exclusive``, else used only when it passes ``check_private``."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if exclusive:
            raise TierDirError(f"disk tier directory {path} appeared while it was being made (another "
                               f"server with the same id in the same place?); refused") from None
    check_private(path)
    return path


def table_component(name: str) -> str:
    """A directory name for table ``name``: itself when it is a plain name, else a hash."""
    if isinstance(name, str) and _COMPONENT.fullmatch(name):
        return name
    return "_table-" + hashlib.sha256(str(name).encode("utf-8", "surrogatepass")).hexdigest()[:24]


def run_dir_of(env) -> Path | None:
    """The run directory a server writes its records to (observe/run_records/rank_records.py reads it the
    same way; the server core does not import observe/)."""
    records = getattr(env, "records", None) or ""
    return Path(records[4:]) if records.startswith("dir:") else None


def base_of(env) -> Path | None:
    """The run directory, else a local checkpoint directory, else None (a temporary one)."""
    run_dir = run_dir_of(env)
    if run_dir is not None:
        return run_dir
    checkpoints = getattr(env, "checkpoint_dir", None)
    if checkpoints and "://" not in str(checkpoints):
        return Path(checkpoints)
    return None


class TierRoot:
    """One server's tier directory, made when its first tiered table is."""

    def __init__(self, base: str | os.PathLike | None, server_id: int):
        self.base = None if base is None else Path(base)
        self.server_id = server_id
        self.path: Path | None = None

    @classmethod
    def for_server(cls, env) -> "TierRoot":
        """Server ``env.server_id``'s; one a killed server left in the same place is removed now."""
        root = cls(base_of(env), env.server_id or 0)
        root.remove_stale()
        return root

    def remove_stale(self) -> None:
        if self.base is None:
            return
        stale = self.base / "tier" / f"server-{self.server_id}"
        try:
            check_private(self.base / "tier")      # nothing is removed from a directory not ours
        except TierDirError:
            return
        if stale.is_dir() and not stale.is_symlink():
            log.info("removing %s: the disk tier of an earlier server %d here, which did not exit",
                     stale, self.server_id)
            shutil.rmtree(stale, ignore_errors=True)

    def table_dir(self, table: str) -> Path:
        root = self._root()
        path = root / table_component(table)
        if path.exists():                 # a table dropped (reset) and registered again: its old files go
            shutil.rmtree(path, ignore_errors=True)
        return private(path, exclusive=True)

    def _root(self) -> Path:
        if self.path is not None and self.path.is_dir():
            return self.path
        if self.base is not None:
            self.base.mkdir(parents=True, exist_ok=True)
            tier = private(self.base / "tier", exclusive=False)
            path = tier / f"server-{self.server_id}"
            if path.exists() or path.is_symlink():
                log.info("removing %s: the disk tier of an earlier server %d here, which did not exit",
                         path, self.server_id)
                if path.is_symlink() or not path.is_dir():
                    path.unlink()
                else:
                    shutil.rmtree(path, ignore_errors=True)
            private(path, exclusive=True)
        else:
            remove_stale_temp_dirs()
            path = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))    # 0700, made exclusively
            check_private(path)
        self.path = path
        atexit.register(self.remove)
        return path

    def remove(self) -> None:
        """Remove the directory and every file in it (at exit; the tables are gone by then)."""
        path, self.path = self.path, None
        if path is None:
            return
        shutil.rmtree(path, ignore_errors=True)
        if self.base is not None:
            try:
                (self.base / "tier").rmdir()     # only when no other server's is left in it
            except OSError:
                pass


def remove_stale_temp_dirs(temp: str | None = None) -> int:
    """Remove temporary tier directories of this user whose process is gone; how many."""
    temp = temp or tempfile.gettempdir()
    removed = 0
    try:
        entries = list(os.scandir(temp))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        pid = entry.name[len(TEMP_PREFIX):].split("-", 1)[0]
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            if not pid.isdigit() or _alive(int(pid)):
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
