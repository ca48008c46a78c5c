"""The PaddlePaddle PS candidates of ps_vs_pytorch.py: Paddle 3.0.0's own parameter server, S servers +
T trainers async, on the same CTR model and data (the worker: ``paddle_ps_ctr.py``).

Paddle lives in its own venv, ``.venv-paddle`` at the repo root (``scripts/install-paddle-peer.sh``):
it pins numpy and protobuf versions of its own, so it never goes into the project's venv. Without that
venv (CI) the candidates are skipped with the reason printed.

One job: free loopback ports for the servers and trainers, the dense initial weights PyTorch draws for
the seed written once as .npy (every engine starts from the same MLP), then every process started by
this driver under ``.venv-paddle/bin/python`` with Paddle's environment contract, its own log file, its
own session (process group). The job ends when every trainer has exited 0 and written its result, or
fails at the deadline, on a trainer's non-zero exit or a server's early exit (with that process's log).
In every case each process group is stopped (SIGTERM, then SIGKILL after a grace), by the PIDs this
driver started; Paddle's servers run until then (``fleet.run_server()`` does not return by itself).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "paddle_ps_ctr.py"
VERSION = "3.0.0"
ONE_THREAD = {"CPU_NUM": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "FLAGS_enable_pir_api": "0"}


def python() -> Path:
    return ROOT / ".venv-paddle" / "bin" / "python"


def available(timeout: float = 120.0) -> tuple[bool, str]:
    """(True, version) when .venv-paddle's python imports paddle VERSION; else (False, why not)."""
    exe = python()
    if not exe.exists():
        return False, f"no {exe.relative_to(ROOT)}: run scripts/install-paddle-peer.sh"
    try:
        out = subprocess.run([str(exe), "-c", "import paddle; print(paddle.__version__)"], capture_output=True,
                             text=True, timeout=timeout, env=dict(os.environ, **ONE_THREAD))
    except subprocess.TimeoutExpired:
        return False, f"{exe} -c 'import paddle' took more than {timeout:g} s"
    version = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0:
        return False, f"{exe} cannot import paddle: {out.stderr.strip().splitlines()[-1:]}"
    if version != VERSION:
        return False, f"{exe} has paddle {version}, not {VERSION}: run scripts/install-paddle-peer.sh"
    return True, version


def write_dense_init(mlp, out: Path) -> Path:
    """PyTorch's initial MLP (nn.Sequential of Linear/ReLU) as w<i>.npy [in, out] and b<i>.npy."""
    out.mkdir(parents=True, exist_ok=True)
    linears = [m for m in mlp if hasattr(m, "weight")]
    for i, lin in enumerate(linears):
        np.save(out / f"w{i}.npy", lin.weight.detach().numpy().T.astype(np.float32))
        np.save(out / f"b{i}.npy", lin.bias.detach().numpy().astype(np.float32))
    return out


def _environ(base: dict, servers: list[str], trainers: list[str], gloo: Path) -> dict:
    env = {k: v for k, v in base.items() if not k.startswith(("PADDLE_", "TRAINING_ROLE", "POD_IP"))}
    env.update(ONE_THREAD, PADDLE_PSERVERS_IP_PORT_LIST=",".join(servers),
               PADDLE_TRAINER_ENDPOINTS=",".join(trainers), PADDLE_TRAINERS_NUM=str(len(trainers)),
               POD_IP=C.HOST, PADDLE_WITH_GLOO="1", PADDLE_GLOO_RENDEZVOUS="2", PADDLE_GLOO_FS_PATH=str(gloo),
               PYTHONUNBUFFERED="1")
    return env


def stop_groups(children: C.Children, grace: float = 5.0) -> None:
    """SIGTERM each process group this driver started, SIGKILL them after ``grace`` (a member a leader
    left behind included); then the usual stop (reaps, removes the logs)."""
    procs = [proc for _, proc, _ in children.popen]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)        # start_new_session: the leader's PID is the group's id
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    children.stop_all(grace)


def run(children: C.Children, tag: str, servers: int, trainers: int, data: Path, init: Path, base_env: dict,
        args, on_poll: Callable[[dict[int, str]], None] | None = None) -> list[dict]:
    """One Paddle PS job to its end or deadline; the trainers' results (the chief's with auc/logloss).
    ``on_poll({pid: "servers" | "trainers"})`` is called every poll while the trainers run."""
    from paramshard.data import auc, logloss
    from paramshard.launch.engines.ports import free_ports
    work = Path(tempfile.mkdtemp(prefix="paddle-", dir=data.parent))
    result, gloo = work / "result", work / "gloo"
    result.mkdir()
    gloo.mkdir()
    ports = free_ports(servers + trainers, C.HOST)
    server_eps = [f"{C.HOST}:{p}" for p in ports[:servers]]
    trainer_eps = [f"{C.HOST}:{p}" for p in ports[servers:]]
    env = _environ(base_env, server_eps, trainer_eps, gloo)
    argv = [str(python()), str(WORKER), "--data", str(data), "--result", str(result), "--init", str(init),
            "--batch", str(args.batch), "--batches", str(args.batches), "--warmup", str(args.warmup),
            "--wait-timeout", str(args.run_timeout)]
    try:
        procs = {}
        for i, ep in enumerate(server_eps):
            procs[f"{tag} server {i}"] = children.spawn(f"{tag} server {i}", argv, dict(
                env, TRAINING_ROLE="PSERVER", PADDLE_PORT=ep.rsplit(":", 1)[1]))
        # Trainer 0 pushes the initial dense values inside init_worker, before Paddle's own wait for the
        # servers (a server not yet listening fails it: "push dense param failed, status[-1]").
        _wait_listening(procs, server_eps, {n: log for n, _, log in children.popen}, args.run_timeout)
        for i, ep in enumerate(trainer_eps):
            procs[f"{tag} trainer {i}"] = children.spawn(f"{tag} trainer {i}", argv, dict(
                env, TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID=str(i), PADDLE_PORT=ep.rsplit(":", 1)[1]))
        logs = {name: log for (name, _, log) in children.popen}
        roles = {proc.pid: "servers" if " server " in name else "trainers" for name, proc in procs.items()}
        _wait(procs, logs, result, trainers, args.run_timeout, on_poll=lambda: on_poll and on_poll(roles))
        out = [json.loads((result / f"trainer-{i}.json").read_text()) for i in range(trainers)]
        chief = out[0]
        if chief.get("probs_file"):
            probs = np.load(result / chief["probs_file"])
            labels = np.load(data / "test_labels.npy")
            chief["auc"], chief["logloss"] = auc(labels, probs), logloss(labels, probs)
        return out
    finally:
        stop_groups(children)
        shutil.rmtree(work, ignore_errors=True)


def _wait_listening(procs: dict, endpoints: list[str], logs: dict, timeout: float) -> None:
    """Until every server accepts a TCP connection on its endpoint; fails early if one exits."""
    deadline = time.monotonic() + timeout
    for (name, proc), ep in zip(procs.items(), endpoints):
        host, port = ep.rsplit(":", 1)
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} (pid {proc.pid}) exited with code {proc.returncode} before listening "
                                   f"on {ep}; its log:\n{C.tail(logs[name], 40)}")
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} did not listen on {ep} within {timeout:g} s; its log:\n"
                                       f"{C.tail(logs[name], 40)}") from None
                time.sleep(0.2)


def chief_of(logs: dict) -> str:
    return next(name for name in logs if name.endswith(" trainer 0"))


def _wait(procs: dict, logs: dict, result: Path, trainers: int, timeout: float, linger: float = 30.0,
          on_poll: Callable[[], object] = lambda: None) -> None:
    """Every trainer exits 0 before the deadline and no server exits before the chief's result. A job
    whose every result is written but whose trainers linger in Paddle's shutdown past ``linger`` s is
    stopped with a warning (its numbers are complete), as run_for_results does for paramshard jobs."""
    deadline = time.monotonic() + timeout
    written_at = None
    while True:
        on_poll()
        written = len(list(result.glob("trainer-*.json"))) == trainers
        running = []
        for name, proc in procs.items():
            code = proc.poll()
            if code not in (None, 0) or (" server " in name and code is not None and not written):
                raise RuntimeError(f"{name} (pid {proc.pid}) exited with code {code}"
                                   f"{'' if written else ' before every trainer wrote its result'}; its log:\n"
                                   f"{C.tail(logs[name], 40)}")
            if " trainer " in name and code is None:
                running.append(name)
        if not running:
            if not written:
                raise RuntimeError(f"the trainers exited with code 0 but {result} lacks some of the {trainers} "
                                   f"results; the chief's log:\n{C.tail(logs[chief_of(logs)], 40)}")
            return
        if written:
            written_at = written_at or time.monotonic()
            if time.monotonic() - written_at > linger:
                print(f"  warning: {', '.join(running)} wrote results but had not exited {linger:g} s later; "
                      f"stopped", file=sys.stderr, flush=True)
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{', '.join(running)} did not finish within {timeout:g} s; the first one's log:\n"
                               f"{C.tail(logs[running[0]], 40)}")
        time.sleep(0.1)
