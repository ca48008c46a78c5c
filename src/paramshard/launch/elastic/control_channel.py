"""Requests to a running launcher, through its run directory (``paramshard scale``).

A command writes ``RUN_DIR/control/request-ID.json`` whole (a temporary file renamed into
place, so the launcher never reads half of one); the launcher's loop polls the directory
(``ControlChannel.poll``), hands each request to the handler of its kind, and writes
``reply-ID.json`` the same way; the command waits for that reply up to a deadline and
removes it. A request is small JSON checked before anything acts on it: ``kind`` (which
handler: ``trainers``, ``servers``, ``add_host``...) and ``value`` (a whole number, or text for
the kinds registered so: ``add_host``'s host), and for the kinds registered ``takes_host`` an
optional ``host`` (text: where the new ranks go, ``scale --servers N --on HOST``). A handler returns the
text of its reply, or raises ConfigError, whose message the command shows as the error.
The command answers by itself, at once, when no launcher will: the job ended (``ENDED``:
written by the channel when the launcher's loop stops answering, or ``summary.json``: written
when the job is over), checked before the request is written and while its reply is awaited,
so a request racing the job's end is answered "the job ended" within a poll. Otherwise, with
no launcher polling (its launcher was killed, or never ran here), it gives up at its deadline.

Nobody else steers it (safe_files.py): the launcher takes a run directory only if it is the
user's and no other user can write it; every file is written under a random name with
``O_EXCL | O_NOFOLLOW`` and renamed into place; a request is read only if it is a regular file
of at most MAX_REQUEST_BYTES (``O_NOFOLLOW | O_NONBLOCK``): anything else named
``request-*.json`` (a directory, a FIFO, a link to /dev/zero) is refused with a warning, removed
when it can be, and the launcher's loop goes on watching its job.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Callable

from paramshard.errors import ConfigError, DeadlineExceeded
from paramshard.log import get_logger
from paramshard.observe.run_records.records import CONTROL, ENDED  # the run directory's layout
from paramshard.safe_files import UnsafeFile, check_private_dir, read_small, write_whole

log = get_logger("launch")

MAX_REQUEST_BYTES = 4096       # a request is a few fields: anything bigger is not one of ours

Handler = Callable[..., str]     # (int) -> str, or (str) -> str for a kind registered with value_type=str
MAX_TEXT_VALUE = 256           # a text value is a host entry: a few words
SUMMARY = "summary.json"       # in the run directory: the job is over (observe/run_records/run_dir.py)
RUN_NAME = re.compile(r"\d{8}-\d{6}-(.+)")   # observe/records.default_run_dir: STAMP-JOBID
MAX_SUMMARY_BYTES = 1 << 20    # a summary names every process: far less than this


def _write_whole(path: Path, data: dict) -> None:
    write_whole(path, json.dumps(data) + "\n")


def _read_small_json(path: Path, limit: int = MAX_REQUEST_BYTES) -> dict:
    """A request or reply from disk, checked to be a small regular file holding a JSON object
    before it is parsed (UnsafeFile if it is no regular file or too big; ValueError: not JSON)."""
    data = json.loads(read_small(path, limit))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


def _when(t) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "?"


def ended(run_dir) -> str | None:
    """Why no launcher will answer a request in ``run_dir`` any more, or None while one may: the
    job's summary (its end time and exit code), else the channel's ENDED mark (its loop stopped
    polling: the job is finishing)."""
    run_dir = Path(run_dir)
    for path in (run_dir / SUMMARY, run_dir / CONTROL / ENDED):
        try:
            data = _read_small_json(path, MAX_REQUEST_BYTES if path.name == ENDED else MAX_SUMMARY_BYTES)
        except FileNotFoundError:
            continue
        except (OSError, ValueError, ConfigError):
            data = {}                               # being written, or damaged: it ended all the same
        if not isinstance(data, dict):
            data = {}
        if path.name == SUMMARY:
            job = f"the job {data['job_id']}" if data.get("job_id") else "the job"
            code, duration = data.get("exit_code"), data.get("duration_s")
            after = f", after {duration:,.0f} s" if isinstance(duration, (int, float)) else ""
            return (f"{job} ended at {_when(data.get('ended'))} (exit code "
                    f"{code if code is not None else '?'}{after})")
        return f"the job ended at {_when(data.get('t'))} ({data.get('reason') or 'its launcher stopped answering'})"
    return None


def send(run_dir, kind: str, value: int | str, timeout: float = 30.0, clock=time.monotonic,
         sleep=time.sleep, host: str | None = None) -> str:
    """Ask the launcher of ``run_dir`` to act (``kind``, ``value``) and return its reply's text;
    ConfigError with the launcher's message if it refused, or saying when the job ended if it
    did (before or while asking: no wait), DeadlineExceeded if no launcher answered."""
    folder = Path(run_dir) / CONTROL
    over = ended(run_dir)
    if over:
        raise ConfigError(f"{over}: there is nothing to change (`paramshard report {run_dir}` tells what it did)")
    if not folder.is_dir():
        raise ConfigError(f"{run_dir} has no {CONTROL}/ directory: not the run directory of a job launched "
                          f"by this version of `paramshard launch` (see `paramshard launch --run-dir`)")
    ident = secrets.token_hex(8)
    request, reply = folder / f"request-{ident}.json", folder / f"reply-{ident}.json"
    _write_whole(request, {"kind": kind, "value": value, **({"host": host} if host else {})})
    deadline = clock() + timeout
    while not reply.exists():
        over = ended(run_dir)
        if over and not reply.exists():     # the launcher's last poll may still have answered it
            request.unlink(missing_ok=True)
            raise ConfigError(f"{over} before it took this request: nothing was changed")
        if clock() >= deadline:
            request.unlink(missing_ok=True)
            raise DeadlineExceeded(f"no launcher answered within {timeout:g} s in {run_dir}, and the job has not "
                                   f"ended there (no {SUMMARY}): was its `paramshard launch` killed? "
                                   f"(it answers within a second while the job runs)")
        sleep(0.05)
    answer = _read_small_json(reply)
    reply.unlink(missing_ok=True)
    if not answer.get("ok"):
        raise ConfigError(str(answer.get("message", "the launcher refused without saying why")))
    return str(answer.get("message", ""))


class ControlChannel:
    """The launcher's side: ``handlers`` maps a request kind to what acts on it."""

    def __init__(self, run_dir, handlers: dict[str, Handler] | None = None, ending: Callable[[], bool] | None = None):
        """``ending``: whether the job is over already (every trainer succeeded, the loop has
        not seen it yet): a request that comes then is answered "the job ended", never acted
        on (a server started for it would be stopped with the job at once)."""
        self.folder = Path(run_dir) / CONTROL
        self.ending = ending
        self.closed: str | None = None          # why no request is acted on any more (close)
        check_private_dir(run_dir)              # whoever can write it could ask for anything
        if not self.folder.exists():
            self.folder.mkdir(mode=0o755)
        check_private_dir(self.folder, "control folder")
        self._refused: set[tuple[str, int]] = set()     # (name, inode) of entries refused, warned about once
        (self.folder / ENDED).unlink(missing_ok=True)       # a job run again in its run directory
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.value_types: dict[str, type[int] | type[str]] = {}     # kind -> the type of its value (int unless registered)
        self.takes_host: set[str] = set()           # kinds whose handler takes host=... (where new ranks go)
        # (kind, value, ok, message), for the summary; the value is -1 for a request refused unread
        self.requests: list[tuple[str, int | str, bool, str]] = []

    def register(self, kind: str, handler: Handler, value_type: type[int] | type[str] = int, takes_host: bool = False) -> None:
        """Handle ``kind`` from now on (replaces a handler registered before: the lead plugs the real
        ``servers`` one in over the placeholder); its requests carry a ``value_type`` (int or str)."""
        self.handlers[kind] = handler
        self.value_types[kind] = value_type
        if takes_host:
            self.takes_host.add(kind)
        else:
            self.takes_host.discard(kind)

    def close(self, reason: str) -> None:
        """No more requests will be acted on (the launcher's loop ends: ``reason``): mark the
        folder so that every command, waiting or to come, says the job ended at once, and
        answer those already waiting so."""
        if self.closed is None:
            self.closed = reason
            _write_whole(self.folder / ENDED, {"t": time.time(), "reason": reason})
        self.poll()

    def poll(self) -> int:
        """Answer every request waiting; returns how many."""
        if self.closed is None and self.ending is not None and self.ending():
            self.close("its trainers finished")
            return 0
        answered = 0
        for path in sorted(self.folder.glob("request-*.json")):
            ident = path.name[len("request-"):-len(".json")]
            if not ident.isalnum():
                self._discard(path, f"{path.name}: not a request name `paramshard scale` writes")
                continue
            try:
                request: dict | Exception = _read_small_json(path)
            except UnsafeFile as exc:
                if not path.is_file() or path.is_symlink():     # no `paramshard scale` wrote it: nobody waits
                    self._discard(path, str(exc))
                    continue
                request = exc                                   # a request too big: its sender hears why
            except (ValueError, OSError) as exc:                # not JSON, or gone meanwhile
                request = exc
            _write_whole(self.folder / f"reply-{ident}.json", self._answer(request))
            path.unlink(missing_ok=True)
            answered += 1
        return answered

    def _discard(self, path: Path, why: str) -> None:
        """Something in control/ that no `paramshard scale` wrote: refused, never read, removed if it
        can be (a directory with files in it stays, ignored), warned about once."""
        try:
            key = (path.name, os.lstat(path).st_ino)
        except OSError:
            return
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        except OSError:
            pass
        if key not in self._refused:
            self._refused.add(key)
            log.warning("control request refused: %s (the job goes on)", why)

    def _answer(self, request: dict | Exception) -> dict:
        kind = None
        try:
            if self.closed is not None:
                raise ConfigError(f"the job ended ({self.closed}) before this request was acted on: nothing "
                                  f"was changed")
            if isinstance(request, Exception):
                raise request
            kind, value = request.get("kind"), request.get("value")
            if not isinstance(kind, str) or kind not in self.handlers:
                raise ConfigError(f"this launcher does not handle {kind!r} requests (it handles: "
                                  f"{', '.join(sorted(self.handlers)) or 'none'})")
            handler = self.handlers[kind]
            wanted = self.value_types.get(kind, int)
            if type(value) is not wanted:
                raise ConfigError(f"a {kind!r} request's value must be "
                                  f"{'a whole number' if wanted is int else 'text'}, got {value!r}")
            assert isinstance(value, (int, str))        # of its kind's type (register: int or str), checked above
            if isinstance(value, str) and not 0 < len(value) <= MAX_TEXT_VALUE:     # str: when wanted is str
                raise ConfigError(f"a {kind!r} request's value must be 1 to {MAX_TEXT_VALUE} characters")
            host = request.get("host")
            if host is None:
                message = handler(value)
            elif kind not in self.takes_host:
                raise ConfigError(f"this launcher cannot place {kind!r} on a named host (--on); leave it out: new "
                                  f"ranks go to the least loaded host (SSH jobs place --servers on a named host)")
            elif type(host) is not str or not 0 < len(host) <= MAX_TEXT_VALUE:
                raise ConfigError(f"a control request's host must be 1 to {MAX_TEXT_VALUE} characters of text")
            else:
                message = handler(value, host=host)
            self.requests.append((kind, value, True, message))
            return {"ok": True, "message": message}
        except (ConfigError, ValueError, OSError) as exc:      # ValueError: not JSON
            self.requests.append((str(kind), -1, False, str(exc)))
            return {"ok": False, "message": str(exc)}


def resolve_run_dir(job: str, runs: Path = Path("runs")) -> Path:
    """JOB as the user names it: a run directory, or a job id whose newest run directory under
    ``runs`` (observe/records.default_run_dir names them STAMP-JOBID) is meant."""
    path = Path(job)
    if path.is_dir():
        return path
    # Exactly STAMP-JOB: never a glob (`job-a*` would pick another job) nor a suffix (`ab12` is
    # not `job-ab12`).
    found = sorted(p for p in runs.iterdir() if (m := RUN_NAME.fullmatch(p.name)) and m.group(1) == job) \
        if runs.is_dir() and "/" not in job else []
    if not found:
        raise ConfigError(f"no such job: {job!r} is neither a run directory nor a job id with a run directory "
                          f"under {runs}/ (give the run directory `paramshard launch` printed)")
    return found[-1]
