"""Files in a directory the launcher writes and reads while a job runs (its run directory),
opened so that nobody else can steer them.

A run directory takes requests (``control/``: `paramshard scale`) and receives files the
launcher writes with the user's rights (logs, records, replies). Whoever can write the
directory could scale the job, or plant a symbolic link where the launcher writes next and
have it overwrite any file of the user. So:

- ``check_private_dir``: the directory must be the user's own and writable by nobody else
  (no group or other write bit); the error says which and how to fix it;
- ``write_whole``: a new file under a random name (``O_CREAT | O_EXCL | O_NOFOLLOW``: never
  an existing file or link), renamed into place (a rename replaces a link, never follows it);
- ``open_append``: ``O_NOFOLLOW`` and ``O_NONBLOCK`` (a FIFO never blocks the open), then the
  file must be a regular file of the user's;
- ``read_small``: ``O_NOFOLLOW | O_NONBLOCK``, a regular file, at most ``limit`` bytes read
  (a link to /dev/zero, a FIFO or a directory is refused, never read).
"""
from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
from pathlib import Path

from paramshard.errors import ConfigError


class UnsafeFile(ConfigError):
    """A path that is not the plain file of this user it should be (a link, a FIFO, a directory,
    too big, someone else's)."""


def _user(uid: int) -> str:
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_private_dir(path, what: str = "run directory") -> None:
    """ConfigError unless ``path`` is a directory owned by this user that no other user can write."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {path} is not a directory")
    me = os.geteuid()
    if st.st_uid != me:
        raise ConfigError(f"{what} {path} belongs to {_user(st.st_uid)}, not to you ({_user(me)}): its owner could "
                          f"scale the job through its control/ folder or plant links that redirect what the launcher "
                          f"writes; give a directory of your own (--run-dir), or leave --run-dir out (runs/STAMP-JOB)")
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("every user", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        raise ConfigError(f"{what} {path} is writable by {' and by '.join(writers)} (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}): anyone who can write it could scale the job through its "
                          f"control/ folder or plant links that redirect what the launcher writes; `chmod go-w {path}` "
                          f"(or give a directory of your own)")


def make_private_dir(path, what: str = "run directory") -> Path:
    """``path`` (made if missing: 0755 whatever the umask leaves of group write), checked as above."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            pass                    # made meanwhile: checked below like any other
    check_private_dir(path, what)
    return path


def _refused(path: Path, exc: OSError, doing: str) -> UnsafeFile:
    if exc.errno == errno.ELOOP:
        return UnsafeFile(f"{path} is a symbolic link: not {doing} through it (remove it)")
    if exc.errno == errno.ENXIO:
        return UnsafeFile(f"{path} is a FIFO or socket, not a file: not {doing} it (remove it)")
    return UnsafeFile(f"{path}: cannot open it safely for {doing} ({exc.strerror})")


def _check_regular(fd: int, path: Path, doing: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
        raise UnsafeFile(f"{path} is {kind}: not {doing} it (remove it)")
    if st.st_uid != os.geteuid():
        raise UnsafeFile(f"{path} belongs to {_user(st.st_uid)}, not to you: not {doing} it (remove it)")
    return st


def write_whole(path, text: str, mode: int = 0o644) -> None:
    """``text`` into ``path`` whole: a new file of a random name (no link or file can be there
    in advance), renamed over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_append(path, buffering: int = 1):
    """``path`` opened to append text, made if missing: never through a link, never a FIFO's
    open that blocks, only a regular file of this user's."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        raise _refused(path, exc, "writing") from None
    try:
        _check_regular(fd, path, "writing")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "a", buffering=buffering, errors="replace")


def read_small(path, limit: int) -> bytes:
    """The bytes of ``path``, a regular file of this user's of at most ``limit`` bytes (UnsafeFile
    otherwise: nothing more than ``limit`` + 1 bytes is ever read). FileNotFoundError if absent."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _refused(path, exc, "reading") from None
    try:
        st = _check_regular(fd, path, "reading")
        if st.st_size > limit:
            raise UnsafeFile(f"{path} is {st.st_size} bytes, larger than {limit} bytes: not read")
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise UnsafeFile(f"{path} is larger than {limit} bytes: not read")
        return data
    finally:
        os.close(fd)
