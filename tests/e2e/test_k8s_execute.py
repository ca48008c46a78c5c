"""`paramshard k8s` manifests, executed: every pod they describe runs here as a process.

No cluster is needed to check what the manifests make the pods do. For each pod the
test plays the kubelet: it fills in the downward-API values (pod index, completion
index, namespace; pod IP -> loopback alias 127.0.0.(10+i) for servers,
127.0.0.(50+j) for trainers, which Linux routes without configuration), resolves
the Secret, plays cluster DNS by rewriting each DNS name (of a server, and of
trainer 0 in collective and hybrid modes) to the address of the pod a headless
Service gives it, and starts the container's command and args as the kubelet does,
$(VAR) references expanded from the container's environment and $$ made $
(`python`/`paramshard` from this venv) in the repository, the image's WORKDIR. The
job must train to the end on its own: trainers exit 0, then the servers exit 0,
and server 0 deletes its Services and StatefulSet through a fake API server
(KUBERNETES_SERVICE_HOST + the test-only PARAMSHARD_K8S_API_URL).
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from paramshard.cli.main import main
from tests.unit.launch.engines.test_k8s_cleanup import FakeKubernetesApi
from tests.unit.launch.engines.test_k8s_manifests import (TRAINER_POLICY, TRAINER_SERVICE, by_kind, kubelet_expand,
                                           pod_dns_names, pod_environ, server_pod, trainer_pod)

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SERVERS, TRAINERS = 2, 2
DEADLINE = 240.0
# Variables of the test's own environment that a pod would not have (or that name another engine).
FOREIGN = ("PARAMSHARD_", "PADDLE_", "OMPI_", "PMI_", "SLURM_", "KUBERNETES_", "RANK", "WORLD_SIZE",
           "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLIBC_TUNABLES", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME",
           "TORCHELASTIC_")


def server_ip(index: int) -> str:
    return f"127.0.0.{10 + index}"


def trainer_ip(index: int) -> str:
    return f"127.0.0.{50 + index}"


def port_free_on(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def port_free_on_every_server_ip() -> int:
    """One port free on each alias (the manifests give every server the same port)."""
    for _ in range(20):
        socks = []
        try:
            first = socket.socket()
            socks.append(first)
            first.bind((server_ip(0), 0))
            port = first.getsockname()[1]
            for i in range(1, SERVERS):
                s = socket.socket()
                socks.append(s)
                s.bind((server_ip(i), port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.fail("no port free on every loopback alias after 20 tries")


def loopback_aliases_work() -> str | None:
    """None if 127.0.0.10.. and 127.0.0.50 can be bound (Linux routes all of 127/8 to lo), else why not."""
    for ip in [*map(server_ip, range(SERVERS)), trainer_ip(0)]:
        try:
            with socket.socket() as s:
                s.bind((ip, 0))
        except OSError as exc:
            return f"cannot bind loopback alias {ip} ({exc}); on macOS add it with ifconfig lo0 alias"
    return None


def executable(argv: list[str]) -> list[str]:
    """The container's command with the image's `python` and `paramshard` resolved to this venv's."""
    head = {"python": sys.executable, "paramshard": str(VENV_BIN / "paramshard")}.get(argv[0], argv[0])
    return [head, *argv[1:]]


def with_cluster_dns(environ: dict[str, str], dns: dict[str, str]) -> dict[str, str]:
    """PARAMSHARD_SERVERS and PARAMSHARD_COLLECTIVE_ADDR with every DNS name replaced by its
    pod's address (KeyError: a name that no headless Service gives a pod)."""
    def resolved(entry: str) -> str:
        host, _, port = entry.rpartition(":")
        return f"{dns[host]}:{port}"
    out = dict(environ)
    servers = [entry for entry in environ["PARAMSHARD_SERVERS"].split(",") if entry]
    out["PARAMSHARD_SERVERS"] = ",".join(resolved(entry) for entry in servers)
    if "PARAMSHARD_COLLECTIVE_ADDR" in environ:
        out["PARAMSHARD_COLLECTIVE_ADDR"] = resolved(environ["PARAMSHARD_COLLECTIVE_ADDR"])
    return out


def render(tmp_path: Path, *flags: str, servers: int = SERVERS) -> dict[str, dict]:
    """`paramshard k8s` for ``servers`` servers (none: collective mode) and TRAINERS trainers, the
    servers on a port free on every alias, trainer 0's store on one free on its address."""
    job_yaml = tmp_path / "job.yaml"
    if servers:
        own = ["--servers", str(servers), "--port", str(port_free_on_every_server_ip()), "--create-secret"]
    else:
        own = []            # collective: --servers defaults to 0, and there is no secret
    if "collective" in flags or "hybrid" in flags:
        own += ["--collective-port", str(port_free_on(trainer_ip(0)))]
    assert main(["k8s", "--trainers", str(TRAINERS), "--image", "paramshard:test", "--name", "digits",
                 "--namespace", "ml", *own, "--out", str(job_yaml), *flags]) == 0
    return by_kind(list(yaml.safe_load_all(job_yaml.read_text())))


def run_pods(kinds: dict[str, dict], workdir: Path, logs_dir: Path) -> tuple[dict, dict, list]:
    """Start every pod of the manifests, wait for all of them: (exit codes, logs, API requests)."""
    job, sts = kinds["Job"], kinds.get("StatefulSet")
    secrets = {kinds["Secret"]["metadata"]["name"]: kinds["Secret"]["stringData"]} if "Secret" in kinds else {}
    servers = sts["spec"]["replicas"] if sts else 0
    pods = [(f"server {i}", sts, server_pod(sts, i, server_ip(i))) for i in range(servers)]
    pods += [(f"trainer {j}", job, trainer_pod(job, j, trainer_ip(j))) for j in range(job["spec"]["completions"])]
    # Cluster DNS: HOSTNAME.SUBDOMAIN.NAMESPACE.svc.cluster.local for each pod a headless Service selects
    # (StatefulSet pod NAME-I under the servers' Service; Indexed Job pod JOB-I under the trainers').
    dns = {}
    for service in (kinds.get("Service"), kinds.get(TRAINER_SERVICE)):
        if service is not None:
            dns.update(pod_dns_names(service, [pod for _, _, pod in pods]))

    base = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    children: dict[str, tuple[subprocess.Popen, Path]] = {}
    with FakeKubernetesApi() as api:
        try:
            for tag, owner, pod in pods:
                container = owner["spec"]["template"]["spec"]["containers"][0]
                declared = pod_environ(container, pod, secrets)
                # The kubelet expands $(VAR) in command and args from the container's own variables.
                argv = [kubelet_expand(word, declared) for word in container["command"] + container["args"]]
                environ = with_cluster_dns(declared, dns)
                # What the kubelet gives every pod, pointed at the fake API server.
                environ.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(api.port),
                               PARAMSHARD_K8S_API_URL=api.url)
                log = logs_dir / f"{tag.replace(' ', '-')}.log"
                with open(log, "wb") as out:
                    children[tag] = (subprocess.Popen(
                        executable(argv), cwd=workdir,
                        env={**base, **environ}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True), log)
            codes = wait_all(children, DEADLINE)
        finally:
            stop_all(children)
        requests = list(api.requests)
    logs = {tag: log.read_text(errors="replace") for tag, (_, log) in children.items()}
    return codes, logs, requests


def cleanup_requests(kinds: dict[str, dict]) -> list[tuple[str, str]]:
    """What server 0 must send at the job's end: the Services (the trainers' first, in hybrid
    mode), then the StatefulSet."""
    ns, name = kinds["StatefulSet"]["metadata"]["namespace"], kinds["StatefulSet"]["metadata"]["name"]
    services = [kinds[key]["metadata"]["name"] for key in (TRAINER_SERVICE, "Service") if key in kinds]
    return [*(("DELETE", f"/api/v1/namespaces/{ns}/services/{service}") for service in services),
            ("DELETE", f"/apis/apps/v1/namespaces/{ns}/statefulsets/{name}")]


def describe(codes: dict, logs: dict) -> str:
    return "\n".join(f"--- {tag} (exit {codes.get(tag)}):\n{text[-2500:]}" for tag, text in logs.items())


@pytest.fixture
def aliases():
    why_not = loopback_aliases_work()
    if why_not:
        pytest.skip(why_not)


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE + 60)
def test_manifests_train_to_completion_as_local_pods(tmp_path, capsys, aliases):
    kinds = render(tmp_path, "--timeout", "60", "examples/digits_mlp.py", "--epochs", "3")
    capsys.readouterr()
    codes, logs, requests = run_pods(kinds, ROOT, tmp_path)      # the repository plays the image's /app
    report = describe(codes, logs)
    assert all(code == 0 for code in codes.values()), report
    # Learning: trainer 0 reports each epoch; the loss falls and the digits are recognised.
    epochs = [(float(loss), float(acc)) for loss, acc in
              re.findall(r"loss (\d+\.\d+)\s+test accuracy (\d\.\d+)", logs["trainer 0"])]
    assert len(epochs) == 3, report
    assert epochs[-1][0] < epochs[0][0] and epochs[-1][1] > 0.85, epochs
    assert f"{TRAINERS} trainers" in logs["trainer 0"] and f"{SERVERS} servers" in logs["trainer 0"]
    # The job's end, as the cluster would see it: server 0 deleted the Service, then the StatefulSet.
    assert [(r["method"], r["path"]) for r in requests] == cleanup_requests(kinds), report
    assert all(r["body"]["propagationPolicy"] == "Background" for r in requests)


CRASHING_TRAINER = """\
import os
import torch
import torch.nn as nn
import paramshard as ps

env = ps.init()
model = nn.Linear(4, 2)
trainer = ps.Trainer(model, optimizer=ps.optim.SGD(lr=0.1))
for step in range(1000):
    if env.trainer_id == 1 and step == 3:
        print("trainer 1 crashes", flush=True)
        os._exit(3)            # no leave: as an OOM kill or a lost node
    trainer.step(model(torch.ones(8, 4)).pow(2).mean())
trainer.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE + 60)
def test_a_failed_trainer_still_ends_the_servers(tmp_path, capsys, aliases):
    """docs/kubernetes.md "What happens on failure": the servers give up on lost trainers
    after --timeout and exit 1, and server 0 still deletes the job's server objects."""
    (tmp_path / "crash.py").write_text(CRASHING_TRAINER)
    kinds = render(tmp_path, "--timeout", "5", "crash.py")
    capsys.readouterr()
    codes, logs, requests = run_pods(kinds, tmp_path, tmp_path)
    report = describe(codes, logs)
    assert codes["trainer 1"] == 3 and codes["trainer 0"] != 0, report
    assert codes["server 0"] == codes["server 1"] == 1, report
    assert [(r["method"], r["path"]) for r in requests] == cleanup_requests(kinds), report


TINY = """\
import paramshard as ps, torch
ps.init()
model = torch.nn.Linear(4, 1)
t = ps.Trainer(model, ps.optim.SGD(lr=0.1))
for _ in range(3):
    t.step(model(torch.ones(2, 4)).sum())
t.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE + 60)
def test_collective_manifests_run_as_local_pods(tmp_path, capsys, aliases):
    """--mode collective: no server pod; trainer 0 hosts the store at its own DNS name (bound on
    its pod address), trainer 1 reaches it by that name, and both finish."""
    (tmp_path / "tiny.py").write_text(TINY)
    kinds = render(tmp_path, "--mode", "collective", "--timeout", "60", "tiny.py", servers=0)
    capsys.readouterr()
    assert sorted(kinds) == ["Job", TRAINER_POLICY, TRAINER_SERVICE]
    codes, logs, requests = run_pods(kinds, tmp_path, tmp_path)
    report = describe(codes, logs)
    assert codes == {"trainer 0": 0, "trainer 1": 0}, report
    store = f"{trainer_ip(0)}:{kinds[TRAINER_SERVICE]['spec']['ports'][0]['port']}"
    for j in range(TRAINERS):
        assert f"trainer {j} joined the gloo group of {TRAINERS} trainers (store {store})" in logs[f"trainer {j}"]
    assert requests == []       # no server, no cleanup: the trainers' Service stays with the Job


# Arguments the kubelet would rewrite if the manifests passed them on as written: the first
# would become the job's secret, the others lose a "$".
DOLLAR_ARGS = ["$(PARAMSHARD_SECRET)", "$$", "$$(PARAMSHARD_JOB_ID)", "cost: $5"]


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE + 60)
def test_hybrid_manifests_run_as_local_pods(tmp_path, capsys, aliases):
    """--mode hybrid: servers and the trainers' group at once; at the end server 0 deletes the
    trainers' Service as well as its own objects. Script arguments with $ reach the script as written."""
    (tmp_path / "tiny.py").write_text("import sys\nprint('script args', sys.argv[1:], flush=True)\n" + TINY)
    kinds = render(tmp_path, "--mode", "hybrid", "--timeout", "60", "tiny.py", *DOLLAR_ARGS)
    capsys.readouterr()
    codes, logs, requests = run_pods(kinds, tmp_path, tmp_path)
    report = describe(codes, logs)
    assert all(code == 0 for code in codes.values()) and len(codes) == SERVERS + TRAINERS, report
    for j in range(TRAINERS):       # servers serve; the trainers run the script
        assert f"script args {DOLLAR_ARGS!r}" in logs[f"trainer {j}"], report
    assert kinds["Secret"]["stringData"]["secret"] not in "".join(logs.values())
    assert f"joined the gloo group of {TRAINERS} trainers" in logs["trainer 1"], report
    assert [(r["method"], r["path"]) for r in requests] == cleanup_requests(kinds), report
    assert [r["path"].rpartition("/")[2] for r in requests] == ["digits-trainers", "digits-server", "digits-server"]


def wait_all(children: dict[str, tuple[subprocess.Popen, Path]], deadline: float) -> dict[str, int]:
    """Exit codes of every child; fails naming the ones still running at the deadline."""
    end = time.monotonic() + deadline
    codes: dict[str, int] = {}
    while len(codes) < len(children) and time.monotonic() < end:
        for tag, (proc, _) in children.items():
            if tag not in codes and proc.poll() is not None:
                codes[tag] = proc.returncode
        time.sleep(0.2)
    running = sorted(set(children) - set(codes))
    if running:
        tails = "\n".join(f"--- {t}:\n{children[t][1].read_text(errors='replace')[-2000:]}" for t in running)
        pytest.fail(f"still running after {deadline:g} s: {', '.join(running)}; exited: {codes}\n{tails}")
    return codes


def stop_all(children: dict[str, tuple[subprocess.Popen, Path]]) -> None:
    """Kill what is left, by the process groups this test started."""
    for proc, _ in children.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(10)
