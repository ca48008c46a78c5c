"""A job's secret where no launcher hands one to every rank (`paramshard run` under srun or torchrun).

mpirun has a channel as trusted as the engine itself (its own MPI transport):
rank 0 makes the secret and sends it to the others there (cli/jobs/run.py). Slurm's
and torchrun's address stores are plain TCP that anyone on the host can read
and write, so a secret must never travel through them. What the ranks do share
is the user's own files: the first rank to get there writes the secret to
``PARAMSHARD_SECRET_DIR/<job id>`` (default ``~/.paramshard/secrets``), a file
that exists only complete and only with mode 0600, in a directory of this user's
that no one else may read (0700); the others read it. Each rank reads it before
it reports to the store, so once every rank has reported the file can go.

Sound only when that directory is private to the user (checked: owner and
mode) and shared by every host of the job (a home directory on NFS, or one
machine). Hosts that do not share it each make their own secret: the ranks
then publish a fingerprint of the keys (``fingerprint``; a 256-bit secret cannot
be guessed from it) and refuse to start when they differ, naming the fix.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Mapping

from paramshard.errors import ConfigError
from paramshard.settings.process_variables import SECRET_DIR
from paramshard.transport.security import new_secret

SECRET_DIR_VARIABLE = SECRET_DIR.env
FIX = (f"set PARAMSHARD_SECRET on every rank (e.g. export it before srun or torchrun), set {SECRET_DIR_VARIABLE} to "
       f"a directory of yours every host of the job shares, or pass --insecure for plain TCP")


def secret_dir(environ: Mapping[str, str]) -> Path:
    """Where the ranks of a job meet their secret: PARAMSHARD_SECRET_DIR, else ~/.paramshard/secrets."""
    given = SECRET_DIR.read(environ)
    return Path(given).expanduser() if given else Path.home() / ".paramshard" / "secrets"


def _file_name(job_id: str) -> str:
    """The job id as a file name: no separators, no leading dot, bounded length."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id).lstrip(".")
    if not name or len(name) > 100:
        name = hashlib.sha256(job_id.encode()).hexdigest()[:32]
    return f"{name}.secret"


def _check_private(path: Path, what: str, allowed: int) -> os.stat_result:
    st = os.stat(path, follow_symlinks=False)
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{what} {path} belongs to user id {st.st_uid}, not to this user ({os.geteuid()}): "
                          f"the job's secret must be in a place of yours alone; {FIX}")
    if stat.S_IMODE(st.st_mode) & ~allowed:
        raise ConfigError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read or change it "
                          f"(chmod {allowed:04o} {path}); {FIX}")
    return st


def shared_secret(environ: Mapping[str, str], job_id: str) -> tuple[str, Path, bool]:
    """(the job's secret, its file, whether this rank made it): made by the first rank to
    come here, read by every other one. The file appears whole (written under another
    name, then hard-linked: a link never replaces an existing file), 0600 from the start."""
    directory = secret_dir(environ)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make {directory} for the job's secret ({exc.strerror}); {FIX}") from None
    if not stat.S_ISDIR(_check_private(directory, "the secrets directory", 0o700).st_mode):
        raise ConfigError(f"{directory} is not a directory; {FIX}")
    path = directory / _file_name(job_id)
    made = False
    tmp = directory / f".{path.name}.{os.getpid()}.{new_secret()[:8]}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_secret() + "\n")
            f.flush()
            os.fsync(f.fileno())     # another host reads it over NFS
        try:
            os.link(tmp, path)
            made = True
        except FileExistsError:
            pass                     # another rank was first: its secret is the job's
    except OSError as exc:
        raise ConfigError(f"cannot write the job's secret in {directory} ({exc.strerror}); {FIX}") from None
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass
    _check_private(path, "the job's secret file", 0o600)
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the job's secret {path} ({exc.strerror}); {FIX}") from None
    if not secret:
        raise ConfigError(f"the job's secret file {path} is empty: remove it; {FIX}")
    return secret, path, made


def fingerprint(server_public_key: bytes) -> str:
    """What ranks compare to see that they hold the same keys: a hash of the servers' public
    key, which says nothing about a random secret."""
    return hashlib.sha256(server_public_key).hexdigest()[:16]
