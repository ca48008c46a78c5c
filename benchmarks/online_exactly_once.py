"""Exactly once under kill -9 (issue 33): a streaming CTR job that publishes deltas while a serving
process follows them; in each run one process is killed with SIGKILL at a seeded random moment,
and the run is checked.

    python benchmarks/online_exactly_once.py [--runs 3] [--kinds trainer,server,serve] [--seed 1]
        [--events 6000] [--model lr] [--work DIR]

The job: `paramshard launch --servers 1 --trainers 1 --mode async --checkpoint-dir CK
--checkpoint-every K --deltas D -m paramshard.apps.ctr --stream LIVE --max-events N` with fixed
seeds, on a fixed event file replayed (`paramshard replay`'s appender, as fast as it goes) into LIVE
before the job starts: a batch is then always --batch-size events, whatever the timing, so an
uninterrupted run is a reference a disturbed one can equal bit for bit. `paramshard serve D` follows
the delta directory from the chief's model.pt on. Kills:

- trainer: kill -9 trainer 0; the job fails (no --max-restarts) and is launched again with --resume
  from its checkpoint directory (new servers restore the checkpoint and publish a snapshot);
  trainer@save: the same, the moment a checkpoint's temporary directory appears (mid-save);
  server@end: server 0 the moment the trainer's final checkpoint is in place (its close);
- server: kill -9 server 0; the launcher restarts it in place (--max-restarts 1), the chief rolls
  the job back to the latest checkpoint, the server's delta sequence goes on with a snapshot;
- serve: kill -9 the serving process; it is started again on D and rebuilds from the snapshots and
  deltas there while the job trains on.

Checks of each run (the verdict line says which failed):
  (a) every event trained once: the run's --json says N events trained, the stream's final
      position is the file's last byte and record, the servers' final step (pushes their state
      holds) is the number of batches; and (stronger) the final checkpoint's rows and
      dense values equal the uninterrupted run's, bit for bit (printed: how many differ, and how
      far, when they do not);
  (b) the serving process, once it has applied each server's last file, serves that version, whose
      rows and dense values (an in-process Replica of D, the same start-and-follow code) equal the
      final checkpoint's bit for bit, at the servers' final step; and the process's scores for
      fresh events equal that replica's (the same version answers the same, bit for bit).
Every wait has a deadline; every child is stopped by the PID this script started.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

PYTHON = sys.executable
MARK = "PSBENCH_EXACTLY_ONCE"          # in every process of one run's job (found through /proc)
FRESH = 400                            # events never streamed, scored by the serving process
DEADLINE = 240.0                       # seconds a job (or a wait for the serving process) may take

KINDS = ("none", "trainer", "trainer@save", "server", "server@end", "serve")     # none: an undisturbed run again (is the job deterministic?)


# -- the data ------------------------------------------------------------------------------------
def prepare(work: Path, events: int, seed: int) -> dict:
    """The schema, the event file replayed into work/live, and fresh events for predictions."""
    import pandas as pd
    from paramshard.data.features.presets import criteo_schema
    from paramshard.data.stream.replay import replay
    from paramshard.data.synthetic import generate_criteo

    work.mkdir(parents=True, exist_ok=True)
    schema = criteo_schema()
    schema.save(work / "schema.json")
    generate_criteo(work / "all.tsv", events + FRESH, seed=seed)
    frame = pd.read_csv(work / "all.tsv", sep="\t", header=None, names=schema.format.names, dtype=str,
                        keep_default_na=False)
    frame.iloc[:events].to_csv(work / "events.csv", index=False)
    live = work / "live"
    if not live.exists():
        replay(frame.iloc[:events], live, rate=0)
    fresh = frame.iloc[events:]
    columns = {c: fresh[c].tolist() for c in schema.format.names if c != schema.label.column}
    return {"schema": work / "schema.json", "live": live, "events": events, "fresh": columns,
            "file": sorted(live.glob("events-*.csv"))}


# -- processes -----------------------------------------------------------------------------------
def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def marked(mark: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _environ(int(p)).get(MARK) == mark]


def rank_pid(mark: str, role: str, index: int = 0) -> int | None:
    key = "PARAMSHARD_SERVER_ID" if role == "server" else "PARAMSHARD_TRAINER_ID"
    for pid in marked(mark):
        env = _environ(pid)
        if env.get("PARAMSHARD_ROLE") == role and env.get(key) == str(index):
            return pid
    return None


class Job:
    """One `paramshard launch` of the stream job, in a process group of its own, output captured."""

    def __init__(self, run: Path, data: dict, args, resume: bool, restarts: int):
        self.mark = uuid.uuid4().hex
        self.out = run / "out.json"
        cmd = [PYTHON, "-m", "paramshard", "launch", "--servers", "1", "--trainers", "1", "--mode", "async",
               "--checkpoint-dir", str(run / "ck"), "--checkpoint-every", str(args.checkpoint_every),
               "--max-restarts", str(restarts), "--deltas", str(run / "deltas"), "--timeout", "30",
               *(["--resume"] if resume else []),
               *(["--max-staleness", str(args.max_staleness)] if args.max_staleness >= 0 else []),
               "-m", "paramshard.apps.ctr", "--stream", str(data["live"]), "--schema", str(data["schema"]),
               "--model", args.model, "--batch-size", str(args.batch_size), "--max-events", str(data["events"]),
               "--seed", "1", "--report-every", "60", "--json", str(self.out)]
        env = {**os.environ, MARK: self.mark, "PARAMSHARD_DELTA_SECONDS": str(args.delta_seconds),
               "PARAMSHARD_DELTA_SNAPSHOT_EVERY": str(args.snapshot_every),
               **({"PARAMSHARD_MAX_IN_FLIGHT": str(args.max_in_flight)} if args.max_in_flight is not None else {})}
        self.log = open(run / ("launch-resume.log" if resume else "launch.log"), "w")
        # Its own session (stop() kills the group), and SIGTERMed if this process dies first: a
        # harness killed mid-run (a test's deadline) leaves no job behind.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=run,
                                     start_new_session=True, preexec_fn=C._die_with_parent)

    def wait(self, timeout: float = DEADLINE) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in marked(self.mark):          # a rank outliving its launcher: never left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


class Serve:
    """`paramshard serve DELTAS --port 0`: its URL from its first line."""

    def __init__(self, deltas: Path, log: Path, poll: float = 0.2):
        self.log = open(log, "a")
        self.proc = subprocess.Popen([PYTHON, "-m", "paramshard", "serve", str(deltas), "--port", "0", "--poll",
                                      str(poll)], stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env={**os.environ, "PARAMSHARD_LOG_LEVEL": "INFO"}, start_new_session=True,
                                     preexec_fn=C._die_with_parent)     # as the job: never outlives us
        self.url: str | None = None
        got = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.log.write(line)
                if self.url is None and " at http://" in line:
                    self.url = line.split(" at ", 1)[1].split()[0]
                    got.set()
        threading.Thread(target=read, daemon=True).start()
        if not got.wait(60) or self.url is None:
            self.stop()
            raise RuntimeError(f"paramshard serve {deltas}: no 'serving ... at URL' line within 60 s (see {log})")

    def get(self, path: str) -> dict:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:       # 503: not ok (a gap...): the body says why
            return json.loads(exc.read())

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def wait_for(what: str, ready, timeout: float, alive=lambda: True, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"{what}: not within {timeout:g} s" if alive() else f"{what}: the job ended first")
        time.sleep(step)


class CreatedIn:
    """Names created in a directory from now on, as the kernel reports them (inotify, through
    libc): a file or directory that lives a few milliseconds is seen however busy this process is."""
    IN_CREATE, IN_NONBLOCK, IN_CLOEXEC = 0x100, 0o4000, 0o2000000

    def __init__(self, directory: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(self.IN_NONBLOCK | self.IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self.fd, os.fsencode(str(directory)), self.IN_CREATE) < 0:
            errno = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(errno, f"inotify_add_watch {directory}")

    def __enter__(self) -> "CreatedIn":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def wait(self, prefix: str, timeout: float, alive=lambda: True, count: int = 1) -> bool:
        """True once ``count`` names starting with ``prefix`` were created; False past ``timeout``
        or once ``alive()`` is false."""
        deadline = time.monotonic() + timeout
        want = prefix.encode()
        while time.monotonic() < deadline and alive():
            if not select.select([self.fd], [], [], 0.05)[0]:
                continue
            data, offset = os.read(self.fd, 1 << 16), 0
            while offset + 16 <= len(data):       # struct inotify_event: wd, mask, cookie, len, name[len]
                _, _, _, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16:offset + 16 + length].rstrip(b"\0")
                if name.startswith(want):
                    count -= 1
                    if count <= 0:
                        return True
                offset += 16 + length
        return False


def published_step(deltas: Path) -> int:
    """The step of the newest file the servers published (0: none yet)."""
    from paramshard.online.delta_format import DeltaError, read_delta
    from paramshard.online.delta_log import DeltaLog
    log, newest = DeltaLog(deltas), 0
    for server in log.servers():
        entries = log.entries(server)
        try:
            newest = max(newest, read_delta(entries[-1].path).step) if entries else newest
        except (DeltaError, OSError):      # pruned between the listing and the read
            pass
    return newest


def checkpoints(ck: Path) -> list[Path]:
    return sorted(ck.glob("step-*")) if ck.is_dir() else []


# -- the oracles ---------------------------------------------------------------------------------
def final_state(ck: Path) -> dict:
    """The final checkpoint: {"tables": {name: (ids sorted, rows)}, "dense": {param: flat values},
    "step": the highest table/block version (the servers' step, as deltas name it)}."""
    from paramshard.checkpoint.format import Checkpoint
    c = Checkpoint(ck)
    m = c.manifest
    tables = {}
    for t in m["sparse"]:
        ids, values = c.array(t["files"]["ids"]), c.array(t["files"]["values"])
        order = np.argsort(ids, kind="stable")
        tables[t["name"]] = (ids[order], values[order])
    dense = {d["name"]: c.array(d["files"]["values"]).reshape(-1) for d in m["dense"]}
    step = max([t["version"] for t in m["sparse"]] + [d["version"] for d in m["dense"]])
    return {"tables": tables, "dense": dense, "step": step, "checkpoint": c.step}


def _bits(a: np.ndarray) -> np.ndarray:
    """The array's bit patterns (-0.0 is not 0.0; a NaN equals the same NaN)."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


def compare(mine: dict, reference: dict) -> list[str]:
    """What differs, bit for bit, between two final states ([] when identical), with how far."""
    out = []
    for name, (ids, rows) in reference["tables"].items():
        got_ids, got = mine["tables"].get(name, (np.zeros(0, np.uint64), None))
        if not np.array_equal(ids, got_ids):
            out.append(f"table {name}: {len(got_ids)} ids against {len(ids)}, "
                       f"{len(np.setxor1d(ids, got_ids))} in one only")
            continue
        if got.dtype != rows.dtype or got.shape != rows.shape:
            out.append(f"table {name}: rows {got.dtype} {got.shape} against {rows.dtype} {rows.shape}")
            continue
        differ = np.any(_bits(rows) != _bits(got), axis=tuple(range(1, rows.ndim)))
        if differ.any():
            out.append(f"table {name}: {int(differ.sum())} of {len(ids)} rows differ (max |diff| "
                       f"{float(np.nanmax(np.abs(rows - got))):.3g})")
    for name, values in reference["dense"].items():
        got = mine["dense"].get(name)
        if got is None or got.dtype != values.dtype or not np.array_equal(_bits(values), _bits(got)):
            far = "missing" if got is None else f"max |diff| {float(np.nanmax(np.abs(values - got))):.3g}"
            out.append(f"dense {name}: {far}")
    return out


def served_rows(replica, final: dict) -> dict:
    """The replica's rows of the final checkpoint's ids (and its row count: no id more, none less)."""
    tables = {}
    with replica.buffer.reading() as (copy, _):
        for name, (ids, _) in final["tables"].items():
            live = copy.tables[name]
            rows = live.lookup(ids)
            tables[name] = (ids if live.num_rows == len(ids) else np.zeros(0, np.uint64), rows)
        dense = {name: p.detach().reshape(-1).numpy().copy() for name, p in copy.params.items()}
    return {"tables": tables, "dense": dense}


def last_files(deltas: Path) -> dict[str, int]:
    from paramshard.online.delta_log import DeltaLog
    log = DeltaLog(deltas)
    return {str(s): log.entries(s)[-1].seq for s in log.servers() if log.entries(s)}


def check_serving(serve: Serve, run: Path, final: dict, fresh: dict) -> tuple[list[str], dict]:
    """(b): what the serving process serves once it applied each server's last file."""
    deltas = run / "deltas"
    want = last_files(deltas)
    health = wait_for("the serving process applying each server's last file",
                      lambda: (lambda h: h if h["version"]["servers"] == want else None)(serve.get("/health")),
                      60.0, lambda: serve.proc.poll() is None, step=0.1)
    failures = [] if health["ok"] else [f"serving process not ok: {health['errors']}"]
    from paramshard.serving.replica import Replica
    replica = Replica(deltas).start()
    try:
        if replica.version["servers"] != want:
            failures.append(f"an in-process replica of {deltas} is at {replica.version}, the files end at {want}")
        if health["version"]["step"] != final["step"]:
            failures.append(f"served step {health['version']['step']} != the final checkpoint's {final['step']}")
        failures += [f"served rows: {d}" for d in compare(served_rows(replica, final), final)]
        answer = serve.post("/predict/batch", {"columns": fresh})
        local, version = replica.score(replica.encoder.from_columns(fresh))
        if answer["version"]["servers"] != version["servers"]:
            failures.append(f"the process answered with {answer['version']}, the replica is at {version}")
        scores = np.array(answer["scores"])
        if not np.array_equal(scores, local):
            failures.append(f"the process's scores differ from the replica's of the same version: "
                            f"{int((scores != local).sum())} of {len(local)}, max |diff| "
                            f"{float(np.abs(scores - local).max()):.3g}")
    finally:
        replica.close()
    return failures, {"version": health["version"], "files_applied": health["files_applied"]}


def check_stream(out: Path, data: dict) -> list[str]:
    """(a), the stream's side: N events trained, the position at the file's end."""
    if not out.is_file():
        return [f"{out}: no --json result (the job did not end normally)"]
    result = json.loads(out.read_text())
    failures = []
    if result["events"] != data["events"]:
        failures.append(f"events trained {result['events']} != {data['events']}")
    files = {p.name: {"bytes": p.stat().st_size, "records": data["events"]} for p in data["file"]}
    if result["position"]["files"] != files:
        failures.append(f"final position {result['position']['files']} != the data's end {files}")
    return failures


def _kill_at_end(run: Path, steps: int, job, pid: int | None, fd: int | None, kind: str) -> str:
    """SIGKILL the rank held by ``fd`` the moment the trainer's final checkpoint is in place; what
    was killed (or why nothing was)."""
    role = kind.split("@")[0]
    if fd is None:
        return f"nothing ({role} 0 not found: the job had ended)"
    try:
        final = run / "ck" / f"step-{steps:08d}" / "manifest.json"
        try:
            wait_for("the final checkpoint", final.is_file, DEADLINE, lambda: job.proc.poll() is None, step=0.001)
        except RuntimeError:
            return f"nothing (the job ended before its final checkpoint was seen; {role} 0 pid {pid})"
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            return f"nothing ({role} 0 pid {pid} had exited when the final checkpoint was seen)"
        return f"{role} 0 pid {pid} once the final checkpoint was in place"
    finally:
        os.close(fd)


# -- one run -------------------------------------------------------------------------------------
def run_once(run: Path, data: dict, args, kind: str | None, rng: random.Random, say=print) -> dict:
    """One job (and its serving process) with ``kind`` killed at a random moment (None: undisturbed)."""
    run.mkdir(parents=True)
    job = Job(run, data, args, resume=False, restarts=0 if kind and kind.startswith("trainer") else 1)
    serve = None
    what: dict = {"kind": kind or "none"}
    try:
        deltas = run / "deltas"
        wait_for("model.pt and a first snapshot in the delta directory",
                 lambda: (deltas / "model.pt").is_file() and last_files(deltas), 120.0, lambda: job.proc.poll() is None)
        serve = Serve(deltas, run / "serve.log")
        if kind is None:
            wait_for("a first checkpoint", lambda: checkpoints(run / "ck"), 120.0, lambda: job.proc.poll() is None)
            first_checkpoint = time.monotonic()
        else:
            # At a random point of the training (a fraction of its steps, read from the step of the
            # newest file the server published, plus up to one publishing period), after the first
            # checkpoint (a rollback or a resume needs one).
            steps = -(-data["events"] // args.batch_size)
            target = int(rng.uniform(args.kill_from, args.kill_to) * steps)
            extra = rng.uniform(0.0, args.delta_seconds)
            wait_for("a first checkpoint", lambda: checkpoints(run / "ck"), 120.0, lambda: job.proc.poll() is None)
            saves = None
            if kind.endswith("@save"):
                # Its moment is the first save after a random pause (up to a publishing period),
                # seen as the kernel reports the save's temporary directory. A target step read
                # from the published deltas came too late on a fast machine: at ~10 ms a step and
                # deltas every 0.25 s the job had ended (or passed the saves counted) by then.
                time.sleep(extra)
                saves = CreatedIn(run / "ck")
            if kind.endswith("@end"):
                # Its moment is the final checkpoint, not a step: take hold of the process while the
                # job trains (a pidfd: no other process can be hit by the kill), not after a random
                # step, when on a loaded machine the job may already have ended.
                end_pid = rank_pid(job.mark, kind.split("@")[0])
                end_fd = os.pidfd_open(end_pid) if end_pid is not None else None
            elif saves is None:
                try:
                    wait_for(f"step {target} published", lambda: published_step(deltas) >= target, DEADLINE,
                             lambda: job.proc.poll() is None)
                except RuntimeError:
                    pass                       # the job ended first: said below
                time.sleep(extra)
            what["target_step"], what["published_step"] = target, published_step(deltas)
            if kind.endswith("@end"):
                what["killed"] = _kill_at_end(run, steps, job, end_pid, end_fd, kind)
                ck = checkpoints(run / "ck")
                what["checkpoint_at_kill"] = ck[-1].name if ck else None
            elif saves is None and job.proc.poll() is not None:
                what["killed"] = "nothing (the job had ended)"
            elif kind == "serve":
                serve.kill()
                what["killed"] = f"serve pid {serve.proc.pid}"
                serve = Serve(deltas, run / "serve.log")
            else:
                role = kind.split("@")[0]
                pid = rank_pid(job.mark, role)
                if pid is not None and saves is not None:
                    # Mid-save: the moment the n-th save's temporary directory appears.
                    with saves:
                        if not saves.wait(".tmp-step-", DEADLINE, lambda: job.proc.poll() is None):
                            pid = None
                if pid is None:
                    what["killed"] = f"nothing ({role} 0 not found: the job had ended)"
                else:
                    os.kill(pid, signal.SIGKILL)
                    ck = checkpoints(run / "ck")
                    what["checkpoint_at_kill"] = ck[-1].name if ck else None
                    what["killed"] = f"{role} 0 pid {pid}" + {"trainer@save": " while it saved a checkpoint"}.get(kind, "")
        code = job.wait()
        if kind is None:
            what["train_s"] = time.monotonic() - first_checkpoint
        killed = what.get("killed", "")
        if (kind and kind.startswith("trainer") and killed.startswith("trainer")) or (
                code != 0 and killed.startswith("server")):
            # The user's --resume. A server killed while the trainer writes its final checkpoint
            # fails the job (close() does not roll back a save); the resume then finds every event
            # trained in the final checkpoint. Killed once it is in place, the restarted server
            # refuses the leave until the trainer rolled back to it: the job ends 0.
            what["first_exit"] = code
            job = Job(run, data, args, resume=True, restarts=0 if kind.startswith("trainer") else 1)
            code = job.wait()
        what["exit"] = code
        failures = [] if code == 0 else [f"the job exited {code} (see {run})"]
        failures += check_stream(run / "out.json", data)
        final = final_state(run / "ck") if code == 0 else None
        if final is not None:
            what["final_checkpoint"] = final["checkpoint"]
            # Each batch is one step, one push of every block: the servers' step counts the pushes their
            # state holds (a rollback takes it back to the checkpoint's): one per batch, none twice.
            batches = -(-data["events"] // args.batch_size)
            if final["step"] != batches:
                failures.append(f"the servers' final step {final['step']} != {batches} batches (a push lost or "
                                f"applied twice)")
            served, what["served"] = check_serving(serve, run, final, data["fresh"])
            failures += served
        what["final"] = final
        what["failures"] = failures
        return what
    finally:
        job.stop()
        if serve is not None:
            serve.stop()


def log_facts(run: Path) -> str:
    """What the logs say happened (rollbacks, restarts), for the report line."""
    text = "".join(p.read_text(errors="replace") for p in sorted(run.glob("launch*.log")))
    facts = []
    if "restarting it in place" in text:
        facts.append("server restarted in place")
    for line in text.splitlines():
        if "rolled back from step" in line:
            facts.append(line.split("|", 1)[-1].strip()[:90])
        if "resumed from the checkpoint" in line:
            facts.append("resumed")
    serve = (run / "serve.log").read_text(errors="replace") if (run / "serve.log").is_file() else ""
    restarts = serve.count("starting again from the servers' latest snapshots")
    if restarts:
        facts.append(f"serve rebuilt from snapshots {restarts}x")
    return "; ".join(facts)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs per kind")
    p.add_argument("--kinds", default="trainer,server,serve", help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--seed", type=int, default=None, help="the kill times' seed (default: random, printed)")
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--model", default="lr")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--delta-seconds", type=float, default=0.5)
    p.add_argument("--snapshot-every", type=int, default=5)
    p.add_argument("--max-staleness", type=int, default=0, help="the job's --max-staleness (-1: unbounded "
                   "async, where a push may still be in flight when the next batch's rows are pulled, so two "
                   "undisturbed runs already differ; 0: one trainer computes what sync does, deterministically)")
    p.add_argument("--max-in-flight", type=int, default=None, help="PARAMSHARD_MAX_IN_FLIGHT of the trainer "
                   "(async pushes left unanswered after step(); default 1, lowered to the staleness bound)")
    p.add_argument("--kill-from", type=float, default=0.1, help="a kill falls when the servers have published "
                   "a step uniformly between these fractions of the run's steps (and up to --delta-seconds after)")
    p.add_argument("--kill-to", type=float, default=0.9)
    p.add_argument("--work", type=Path, default=None)
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        p.error(f"--kinds: {unknown} not among {KINDS}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    work = args.work or Path(f"/tmp/online-exactly-once-{os.getpid()}")
    print(f"seed {seed}; work {work}; {args.events} events, model {args.model}, batch {args.batch_size}, "
          f"checkpoints every {args.checkpoint_every} steps, deltas every {args.delta_seconds} s, a snapshot "
          f"every {args.snapshot_every}, --max-staleness {args.max_staleness}, max in flight "
          f"{args.max_in_flight if args.max_in_flight is not None else 'default'}", flush=True)
    rng = random.Random(seed)
    data = prepare(work, args.events, 7)
    started = time.monotonic()
    reference = run_once(work / "reference", data, args, None, rng)
    print(f"reference (undisturbed): exit {reference['exit']}, {'; '.join(reference['failures']) or 'checks pass'} "
          f"({time.monotonic() - started:.0f} s)", flush=True)
    if reference["final"] is None:
        return 1
    print(f"the undisturbed run trained {reference['train_s']:.1f} s after its first checkpoint", flush=True)
    totals: dict[str, list[int]] = {k: [0, 0, 0] for k in kinds}     # runs, (a)+(b) pass, identical to reference
    for i in range(args.runs):
        for kind in kinds:
            run = work / f"{kind}-{i}"
            started = time.monotonic()
            what = run_once(run, data, args, None if kind == "none" else kind, rng)
            same = compare(what["final"], reference["final"]) if what["final"] else ["no final checkpoint"]
            totals[kind][0] += 1
            totals[kind][1] += not what["failures"]
            totals[kind][2] += not same
            verdict = "PASS" if not what["failures"] else "FAIL: " + "; ".join(what["failures"])
            print(f"{kind} #{i}: killed {what.get('killed')} at published step {what.get('published_step')} "
                  f"(drawn: {what.get('target_step')}); "
                  + (f"the job exited {what['first_exit']}, --resume: " if "first_exit" in what else "") +
                  f"exit {what['exit']}; {log_facts(run)}; served {what.get('served')}\n"
                  f"  (a)+(b): {verdict}\n  final model vs the undisturbed run: "
                  f"{'bit-identical' if not same else 'DIFFERS: ' + '; '.join(same)} ({time.monotonic() - started:.0f} s)",
                  flush=True)
    print("\nkind     runs  (a)+(b) pass  final = undisturbed")
    for kind, (runs, ok, same) in totals.items():
        print(f"{kind:8} {runs:4}  {ok:12}  {same:19}")
    return 0 if all(ok == runs for runs, ok, _ in totals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
