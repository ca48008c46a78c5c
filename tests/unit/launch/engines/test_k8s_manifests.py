"""`paramshard k8s`: the manifests pass the Kubernetes schema, and mean what the job needs.

The schema (kubernetes-validate --strict, Kubernetes 1.32) catches misspelt or misplaced
fields; the rest of this file checks what no schema can: ids and addresses every pod
derives, selectors, restart policies, RBAC, and that the environment contract is complete
(each pod's environment, downward-API values filled in, read by ClusterEnv.from_environ).
Collective and hybrid modes add the trainers' headless Service: trainer 0's stable DNS
name is where the others find the store it hosts.

Secure by default: every pod meets Pod Security "restricted" (checked rule by rule), the
servers always read a secret unless --insecure, NetworkPolicies admit only the job's pods,
and script arguments reach the script as written (the kubelet's $(VAR) expansion, played here).
"""
from __future__ import annotations

import copy
import math
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Mapping

import pytest
import yaml

from paramshard.cli.main import main
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.launch.engines.k8s import RUN_AS_ID, K8sJobSpec, render_manifests, to_yaml

CLUSTER_DOMAIN = "cluster.local"
FLAG_SETS = {
    "defaults": ["--servers", "1", "--trainers", "1", "--image", "paramshard:0.1.0", "train.py"],
    "everything": ["--servers", "3", "--trainers", "4", "--image", "registry.example.com/team/ps:1.2",
                   "--name", "ctr-job", "--namespace", "ml-team", "--mode", "async", "--port", "7000",
                   "--timeout", "300", "--cpu", "500m", "--memory", "512Mi", "--create-secret",
                   "examples/ctr_wide_deep.py", "--epochs", "3", "--workdir", "/tmp/run dir"],
    "big": ["--servers", "8", "--trainers", "16", "--image", "ps@sha256:" + "a" * 64, "--cpu", "4",
            "--memory", "16Gi", "--cluster-domain", "corp.internal", "--name", "p" + "x" * 44, "job.py"],
    # No servers: --servers left out (0 is the default with collective).
    "collective": ["--mode", "collective", "--trainers", "3", "--image", "img:1", "--name", "allreduce",
                   "--namespace", "ml-team", "--collective-port", "29555", "--cluster-domain", "corp.internal",
                   "train.py", "--epochs", "2"],
    "hybrid": ["--servers", "2", "--trainers", "4", "--mode", "hybrid", "--image", "img:1", "--name", "ctr",
               "--create-secret", "-m", "mypkg.train", "--lr", "0.1"],
    "existing-secret": ["--servers", "2", "--trainers", "2", "--image", "img:1", "--existing-secret",
                        "--namespace", "ml-team", "train.py"],
    "insecure": ["--servers", "2", "--trainers", "2", "--mode", "hybrid", "--image", "img:1", "--insecure",
                 "train.py", "$(PARAMSHARD_JOB_ID)"],
}
# The flag sets with parameter servers (a StatefulSet), and those whose trainers form a group.
WITH_SERVERS = {k: v for k, v in FLAG_SETS.items() if k != "collective"}
COLLECTIVE = {k: v for k, v in FLAG_SETS.items() if k in ("collective", "hybrid")}


def flag(flags: list[str], name: str, default: str | None = None) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else default


# -- running the command -------------------------------------------------------
def k8s(capsys, *args: str) -> tuple[int, str, str]:
    """`paramshard k8s ARGS` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(["k8s", *args])
    except SystemExit as exc:       # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def rendered(capsys, args: list[str]) -> list[dict]:
    code, out, err = k8s(capsys, *args)
    assert code == 0, err
    return list(yaml.safe_load_all(out))


TRAINER_SERVICE = "TrainerService"
TRAINER_POLICY = "TrainerNetworkPolicy"


def by_kind(docs: list[dict]) -> dict[str, dict]:
    """Kind -> the one object of that kind; the trainers' Service and NetworkPolicy (collective,
    hybrid) are keyed TRAINER_SERVICE and TRAINER_POLICY, "Service" and "NetworkPolicy" being
    the servers'."""
    def key(d):
        trainers = (d["kind"] in ("Service", "NetworkPolicy")
                    and d["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer")
        return f"Trainer{d['kind']}" if trainers else d["kind"]
    kinds = [key(d) for d in docs]
    assert len(kinds) == len(set(kinds)), kinds
    return {key(d): d for d in docs}


# -- "running" a pod: what its environment becomes --------------------------------
_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: dict, path: str) -> str:
    """A downward-API fieldPath read from a pod object, as the kubelet does."""
    m = _FIELD.match(path)
    if m:
        return pod["metadata"][m.group(1)][m.group(2)]     # KeyError: the pod has no such label
    value = pod
    for part in path.split("."):
        value = value[part]
    return value


def _cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def pod_environ(container: dict, pod: dict, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's environment with every valueFrom resolved (fieldRef from ``pod``,
    secretKeyRef from ``secrets``, resourceFieldRef from its own resources)."""
    environ = {}
    for var in container["env"]:
        if "value" in var:
            environ[var["name"]] = var["value"]
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            environ[var["name"]] = str(field_value(pod, source["fieldRef"]["fieldPath"]))
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            environ[var["name"]] = secrets[ref["name"]][ref["key"]]
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            assert ref["containerName"] == container["name"]
            kind, resource = ref["resource"].split(".")
            assert (resource, ref["divisor"]) == ("cpu", "1")
            # The kubelet rounds up to a whole multiple of the divisor.
            environ[var["name"]] = str(math.ceil(_cores(container["resources"][kind]["cpu"])))
        else:
            raise AssertionError(f"unknown valueFrom in {var}")
    return environ


def server_pod(statefulset: dict, index: int, pod_ip: str) -> dict:
    """A server pod as the StatefulSet controller makes it (name, pod-index label, IP; its
    hostname is its name, its subdomain the StatefulSet's serviceName)."""
    meta = statefulset["metadata"]
    return {"metadata": {"name": f"{meta['name']}-{index}", "namespace": meta["namespace"],
                         "labels": {**statefulset["spec"]["template"]["metadata"]["labels"],
                                    "apps.kubernetes.io/pod-index": str(index)},
                         "annotations": {}},
            "spec": {"hostname": f"{meta['name']}-{index}", "subdomain": statefulset["spec"]["serviceName"]},
            "status": {"podIP": pod_ip}}


def trainer_pod(job: dict, index: int, pod_ip: str) -> dict:
    """A trainer pod as the Job controller makes it (completion index annotation and label;
    an Indexed Job's pods get the hostname JOBNAME-INDEX, the template's subdomain kept)."""
    meta, template = job["metadata"], job["spec"]["template"]
    pod = {"metadata": {"name": f"{meta['name']}-{index}-abcde", "namespace": meta["namespace"],
                        "labels": {**template["metadata"]["labels"],
                                   "batch.kubernetes.io/job-completion-index": str(index)},
                        "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
           "spec": {"hostname": f"{meta['name']}-{index}"},
           "status": {"podIP": pod_ip}}
    if "subdomain" in template["spec"]:
        pod["spec"]["subdomain"] = template["spec"]["subdomain"]
    return pod


def pod_dns_names(service: dict, pods: list[dict], domain: str = CLUSTER_DOMAIN) -> dict[str, str]:
    """What cluster DNS serves for a headless Service: HOSTNAME.SUBDOMAIN.NS.svc.DOMAIN -> pod IP,
    for every pod the Service selects whose subdomain is the Service's name."""
    meta, selector = service["metadata"], service["spec"]["selector"]
    assert service["spec"]["clusterIP"] == "None"
    return {f"{pod['spec']['hostname']}.{meta['name']}.{meta['namespace']}.svc.{domain}": pod["status"]["podIP"]
            for pod in pods
            if selector.items() <= pod["metadata"]["labels"].items()
            and pod["spec"].get("subdomain") == meta["name"] and pod["metadata"]["namespace"] == meta["namespace"]}


def secrets_of(docs: list[dict], value_if_made_by_hand: str = "made-by-kubectl") -> dict[str, dict[str, str]]:
    """Secret name -> data: the generated Secret, or the one `kubectl create secret` would make
    ({} when no pod reads a secret: collective mode)."""
    kinds = by_kind(docs)
    if "Secret" in kinds:
        return {kinds["Secret"]["metadata"]["name"]: kinds["Secret"]["stringData"]}
    refs = [v["valueFrom"]["secretKeyRef"] for v in kinds["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]
            if v["name"] == "PARAMSHARD_SECRET"]
    return {ref["name"]: {ref["key"]: value_if_made_by_hand} for ref in refs}


def dns_address(statefulset: dict, index: int, domain: str = CLUSTER_DOMAIN) -> str:
    """What DNS calls pod I of a StatefulSet under its headless Service (hostname.subdomain.ns.svc.domain)."""
    meta, spec = statefulset["metadata"], statefulset["spec"]
    port = spec["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    return f"{meta['name']}-{index}.{spec['serviceName']}.{meta['namespace']}.svc.{domain}:{port}"


# -- (a) the schema ---------------------------------------------------------------
@pytest.mark.parametrize("flags, kinds", [
    (FLAG_SETS["everything"], ["ServiceAccount", "Role", "RoleBinding", "Secret", "NetworkPolicy", "Service",
                               "StatefulSet", "Job"]),
    (FLAG_SETS["defaults"], ["ServiceAccount", "Role", "RoleBinding", "Secret", "NetworkPolicy", "Service",
                             "StatefulSet", "Job"]),
    (FLAG_SETS["hybrid"], ["ServiceAccount", "Role", "RoleBinding", "Secret", "NetworkPolicy", "NetworkPolicy",
                           "Service", "Service", "StatefulSet", "Job"]),
    (FLAG_SETS["existing-secret"], ["ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "Service",
                                    "StatefulSet", "Job"]),
    (FLAG_SETS["collective"], ["NetworkPolicy", "Service", "Job"]),
], ids=["async", "defaults", "hybrid", "existing-secret", "collective"])
def test_stdout_is_yaml_in_creation_order(capsys, flags, kinds):
    docs = rendered(capsys, flags)
    # The RBAC, the Secret, the NetworkPolicies and the Services exist before the pods that use them.
    assert [d["kind"] for d in docs] == kinds
    assert {d["metadata"]["namespace"] for d in docs} == {flag(flags, "--namespace", "default")}


# -- (b) what the schema cannot say ---------------------------------------------------
@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
def test_trainers_are_an_indexed_job_that_never_retries(capsys, flags):
    kinds = by_kind(rendered(capsys, flags))
    job = kinds["Job"]["spec"]
    trainers = int(flags[flags.index("--trainers") + 1])
    assert job["completionMode"] == "Indexed"
    assert job["parallelism"] == job["completions"] == trainers
    assert job["backoffLimit"] == 0 and job["template"]["spec"]["restartPolicy"] == "Never"
    assert "selector" not in job            # the Job controller makes its own
    assert job["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("flags", WITH_SERVERS.values(), ids=WITH_SERVERS.keys())
def test_servers_are_a_parallel_statefulset_behind_a_headless_service(capsys, flags):
    kinds = by_kind(rendered(capsys, flags))
    service, sts = kinds["Service"], kinds["StatefulSet"]
    servers = int(flags[flags.index("--servers") + 1])
    assert sts["spec"]["replicas"] == servers
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    template_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    assert service["spec"]["selector"].items() <= template_labels.items()
    # ... and the Service selects no trainer: the server names resolve to servers only.
    trainer_labels = kinds["Job"]["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= trainer_labels.items()
    pod = sts["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Always"
    container = pod["containers"][0]
    assert [p["containerPort"] for p in container["ports"]] == [service["spec"]["ports"][0]["port"]]
    assert service["spec"]["ports"][0]["targetPort"] == service["spec"]["ports"][0]["port"]


@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
def test_every_pod_environment_is_a_complete_contract(capsys, flags):
    """Every pod, its downward-API values filled in, reads as the ClusterEnv it must be:
    equality with the expected ClusterEnv proves no variable is missing or wrong."""
    docs = rendered(capsys, flags)
    kinds, secrets = by_kind(docs), secrets_of(docs)
    job = kinds["Job"]
    sts = kinds.get("StatefulSet")
    servers, trainers = sts["spec"]["replicas"] if sts else 0, job["spec"]["completions"]
    name = job["metadata"]["name"].removesuffix("-trainer")
    mode = flag(flags, "--mode", "sync")
    domain = flag(flags, "--cluster-domain", CLUSTER_DOMAIN)
    addresses = tuple(dns_address(sts, i, domain) for i in range(servers))
    # The secret keys the connections to servers: without servers, no pod reads one; with
    # servers every pod does, unless --insecure, which every pod is told of.
    insecure = "--insecure" in flags
    secret = [data["secret"] for data in secrets.values()]
    assert len(secret) == (1 if servers and not insecure else 0)
    common = dict(servers=addresses, num_trainers=trainers, secret=secret[0] if secret else None, job_id=name,
                  mode=mode, timeout=float(flag(flags, "--timeout", "120")))
    for i in range(servers):
        ip = f"10.1.0.{i + 1}"
        environ = pod_environ(sts["spec"]["template"]["spec"]["containers"][0], server_pod(sts, i, ip), secrets)
        assert environ.pop("PARAMSHARD_INSECURE", None) == ("1" if insecure else None)
        assert ClusterEnv.from_environ(environ) == ClusterEnv(role="server", server_id=i, bind=ip, **common)
        assert environ["PARAMSHARD_K8S_NAMESPACE"] == sts["metadata"]["namespace"]
    # Trainer 0's DNS name (hostname JOB-0 under the trainers' Service) and the store's port.
    store = (f"{name}-trainer-0.{name}-trainers.{flag(flags, '--namespace', 'default')}.svc.{domain}:"
             f"{flag(flags, '--collective-port', '29500')}" if mode in ("collective", "hybrid") else None)
    for j in range(trainers):
        environ = pod_environ(job["spec"]["template"]["spec"]["containers"][0],
                              trainer_pod(job, j, f"10.2.0.{j + 1}"), secrets)
        assert environ.pop("PARAMSHARD_INSECURE", None) == ("1" if insecure else None)
        assert ClusterEnv.from_environ(environ) == ClusterEnv(role="trainer", trainer_id=j, collective_addr=store,
                                                              **common)
        assert "PARAMSHARD_K8S_DELETE" not in environ      # trainers delete nothing


def test_threads_follow_the_cpu_limit(capsys):
    docs = rendered(capsys, FLAG_SETS["everything"])     # --cpu 500m
    sts = by_kind(docs)["StatefulSet"]
    environ = pod_environ(sts["spec"]["template"]["spec"]["containers"][0], server_pod(sts, 0, "10.1.0.1"),
                          secrets_of(docs))
    assert environ["OMP_NUM_THREADS"] == "1"
    resources = sts["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "500m", "memory": "512Mi"}


def test_both_roles_run_the_script_with_its_arguments(capsys):
    kinds = by_kind(rendered(capsys, FLAG_SETS["everything"]))
    for kind in ("StatefulSet", "Job"):
        container = kinds[kind]["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] + container["args"] == [
            "paramshard", "run", "--servers", "3", "examples/ctr_wide_deep.py",
            "--epochs", "3", "--workdir", "/tmp/run dir"]


def test_server_may_delete_exactly_its_statefulset_and_service(capsys):
    kinds = by_kind(rendered(capsys, FLAG_SETS["everything"]))
    account, role, binding = kinds["ServiceAccount"], kinds["Role"], kinds["RoleBinding"]
    sts, service = kinds["StatefulSet"], kinds["Service"]
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    granted = {(group, resource, name) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for name in rule["resourceNames"]}
    assert granted == {("apps", "statefulsets", sts["metadata"]["name"]),
                       ("", "services", service["metadata"]["name"])}
    assert all(rule["verbs"] == ["delete"] for rule in role["rules"])
    # What the server asks to delete is what it may delete; the Service first, as deleting
    # the StatefulSet ends the asking pod.
    env = {v["name"]: v.get("value") for v in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PARAMSHARD_K8S_DELETE"] == (f"services/{service['metadata']['name']},"
                                            f"statefulsets/{sts['metadata']['name']}")


# -- secure by default: no server runs without a secret unless --insecure ----------------------
def server_and_trainer_containers(kinds: dict[str, dict]) -> list[dict]:
    return [kinds[kind]["spec"]["template"]["spec"]["containers"][0] for kind in ("StatefulSet", "Job")
            if kind in kinds]


@pytest.mark.parametrize("mode", ["sync", "async", "hybrid"])
@pytest.mark.parametrize("choice", [[], ["--create-secret"], ["--existing-secret"]], ids=["default", "create",
                                                                                          "existing"])
def test_servers_always_read_a_secret_unless_insecure(capsys, mode, choice):
    """Every flag combination with servers: each pod reads PARAMSHARD_SECRET from a Secret it
    cannot start without, and that Secret is either in the output or the one made by hand."""
    docs = rendered(capsys, ["--servers", "2", "--trainers", "2", "--mode", mode, "--image", "img", *choice,
                             "t.py"])
    kinds = by_kind(docs)
    for container in server_and_trainer_containers(kinds):
        refs = [v["valueFrom"]["secretKeyRef"] for v in container["env"] if v["name"] == "PARAMSHARD_SECRET"]
        assert refs == [{"name": "paramshard-secret", "key": "secret", "optional": False}], container["env"]
        assert "PARAMSHARD_INSECURE" not in {v["name"] for v in container["env"]}
    if choice == ["--existing-secret"]:
        assert "Secret" not in kinds
    else:
        assert re.fullmatch(r"[0-9a-f]{64}", kinds["Secret"]["stringData"]["secret"])


def test_insecure_is_explicit_and_every_pod_says_so(capsys):
    code, out, err = k8s(capsys, *FLAG_SETS["insecure"])
    assert code == 0, err
    kinds = by_kind(list(yaml.safe_load_all(out)))
    assert "Secret" not in kinds and "PARAMSHARD_SECRET" not in out
    for container in server_and_trainer_containers(kinds):
        assert {"name": "PARAMSHARD_INSECURE", "value": "1"} in container["env"]
    assert "--insecure: the servers accept any connection" in err


@pytest.mark.parametrize("servers", [1, 3])
def test_a_spec_with_servers_and_no_secret_source_is_refused(servers):
    with pytest.raises(ConfigError, match="servers need PARAMSHARD_SECRET: .*--existing-secret.*--insecure"):
        K8sJobSpec(script="t.py", image="img", servers=servers, trainers=1)
    with pytest.raises(ConfigError, match="--create-secret and --insecure: give only one"):
        K8sJobSpec(script="t.py", image="img", servers=servers, trainers=1, secret="s", insecure=True)


def test_secret_is_generated_fresh_for_every_job(capsys):
    made = [by_kind(rendered(capsys, FLAG_SETS[name]))["Secret"]["stringData"]["secret"]
            for name in ("defaults", "defaults", "everything")]
    assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in made) and len(set(made)) == 3


def test_existing_secret_command_never_makes_an_empty_secret(capsys, tmp_path):
    """The printed command, run by sh: with openssl it makes the Secret the pods reference;
    without openssl it makes none (a Secret with an empty value would read as no secret)."""
    code, out, err = k8s(capsys, *FLAG_SETS["existing-secret"])
    assert code == 0 and "stringData" not in out
    command = err.splitlines()[-1]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "kubectl-args"
    (bin_dir / "kubectl").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {calls}\n")
    (bin_dir / "kubectl").chmod(0o755)

    def run_command() -> list[str] | None:
        calls.unlink(missing_ok=True)
        subprocess.run(["/bin/sh", "-c", command], env={"PATH": str(bin_dir)}, capture_output=True, timeout=10)
        return calls.read_text().splitlines() if calls.exists() else None

    assert run_command() is None                       # no openssl: no kubectl call at all
    (bin_dir / "openssl").write_text("#!/bin/sh\necho 0123abcd\n")
    (bin_dir / "openssl").chmod(0o755)
    assert run_command() == ["create", "secret", "generic", "paramshard-secret", "--namespace", "ml-team",
                             "--from-literal=secret=0123abcd"]


def test_out_file_holding_the_secret_is_private(capsys, tmp_path):
    out = tmp_path / "job.yaml"
    out.write_text("old")
    out.chmod(0o644)                                   # an existing file keeps no wider mode
    code, _, err = k8s(capsys, "--out", str(out), *FLAG_SETS["defaults"])
    assert code == 0 and "mode 0600: it holds Secret paramshard-secret" in err
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and "stringData" in out.read_text()
    # No secret in it: the file is an ordinary one.
    shared = tmp_path / "shared.yaml"
    code, _, err = k8s(capsys, "--out", str(shared), *FLAG_SETS["existing-secret"])
    assert code == 0 and err.startswith(f"wrote {shared}\n")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o666 & ~_umask()


def test_stdout_redirected_to_a_file_is_made_private(capsys, tmp_path, monkeypatch):
    """`paramshard k8s ... > job.yaml`: the shell creates job.yaml with its umask."""
    path = tmp_path / "job.yaml"
    with open(path, "w") as f:
        os.chmod(path, 0o644)
        monkeypatch.setattr(sys, "stdout", f)
        assert main(["k8s", *FLAG_SETS["defaults"]]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "stringData" in path.read_text()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("mode, servers", [("sync", 2), ("hybrid", 2), ("collective", 0)])
def test_spec_is_pure_and_yaml_round_trips(mode, servers):
    spec = K8sJobSpec(script="t.py", image="img", servers=servers, trainers=3, mode=mode,
                      secret="s3cret" if servers else None)
    assert render_manifests(spec) == render_manifests(spec)
    assert list(yaml.safe_load_all(to_yaml(render_manifests(spec)))) == render_manifests(spec)
    assert "s3cret" not in repr(spec)


# -- collective and hybrid: the trainers find trainer 0 -----------------------------------
@pytest.mark.parametrize("flags", COLLECTIVE.values(), ids=COLLECTIVE.keys())
def test_trainer_0_has_a_stable_dns_name_for_the_store(capsys, flags):
    kinds = by_kind(rendered(capsys, flags))
    service, job = kinds[TRAINER_SERVICE], kinds["Job"]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    port = int(flag(flags, "--collective-port", "29500"))
    # The pods' subdomain is the trainers' headless Service, which selects exactly the trainers.
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    if "StatefulSet" in kinds:
        assert not service["spec"]["selector"].items() <= kinds["StatefulSet"]["spec"]["template"]["metadata"][
            "labels"].items()
    assert service["spec"]["ports"] == [{"name": "collective", "port": port, "targetPort": port, "protocol": "TCP"}]
    assert container["ports"] == [{"name": "collective", "containerPort": port, "protocol": "TCP"}]
    # Cluster DNS, as it serves the Service's pods: PARAMSHARD_COLLECTIVE_ADDR is completion index 0's name.
    domain = flag(flags, "--cluster-domain", CLUSTER_DOMAIN)
    pods = [trainer_pod(job, j, f"10.2.0.{j + 1}") for j in range(job["spec"]["completions"])]
    dns = pod_dns_names(service, pods, domain)
    assert len(dns) == len(pods)
    env = {v["name"]: v.get("value") for v in container["env"]}
    host, _, store_port = env["PARAMSHARD_COLLECTIVE_ADDR"].rpartition(":")
    assert dns[host] == "10.2.0.1" and int(store_port) == port
    # The Indexed Job's hostname for index 0 is JOBNAME-0: the Job's name is the one in the address.
    assert host.split(".")[0] == f"{job['metadata']['name']}-0"


def test_collective_has_no_server_objects(capsys):
    code, out, err = k8s(capsys, *FLAG_SETS["collective"])
    assert code == 0, err
    kinds = by_kind(list(yaml.safe_load_all(out)))
    assert sorted(kinds) == ["Job", TRAINER_POLICY, TRAINER_SERVICE]
    # Nothing names a server object, a service account or a secret, and no pod waits for one.
    assert "allreduce-server" not in out and "serviceAccountName" not in out and "secret" not in out.lower()
    assert err == ""            # no `kubectl create secret` to run
    container = kinds["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] + container["args"] == ["paramshard", "run", "--servers", "0", "train.py",
                                                        "--epochs", "2"]
    env = {v["name"]: v.get("value") for v in container["env"]}
    assert env["PARAMSHARD_SERVERS"] == "" and env["PARAMSHARD_MODE"] == "collective"


def test_hybrid_server_0_also_deletes_the_trainers_service(capsys):
    kinds = by_kind(rendered(capsys, FLAG_SETS["hybrid"]))
    role, sts = kinds["Role"], kinds["StatefulSet"]
    services = [kinds["Service"]["metadata"]["name"], kinds[TRAINER_SERVICE]["metadata"]["name"]]
    granted = {(group, resource, name) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for name in rule["resourceNames"]}
    assert granted == {("apps", "statefulsets", sts["metadata"]["name"]), *(("", "services", s) for s in services)}
    env = {v["name"]: v.get("value") for v in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    # Services first, the StatefulSet (the asking pod's own) last.
    assert env["PARAMSHARD_K8S_DELETE"] == (f"services/{services[1]},services/{services[0]},"
                                            f"statefulsets/{sts['metadata']['name']}")


@pytest.mark.parametrize("flags, servers", [
    (["--mode", "collective"], 0), (["--mode", "collective", "--servers", "0"], 0), (["--mode", "hybrid"], 1),
    ([], 1)])
def test_servers_default_to_0_with_collective_else_1(capsys, flags, servers):
    kinds = by_kind(rendered(capsys, ["--trainers", "2", "--image", "img", *flags, "t.py"]))
    assert kinds.get("StatefulSet", {"spec": {"replicas": 0}})["spec"]["replicas"] == servers


# -- bad flags ---------------------------------------------------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--servers", "0"], "--servers 0: sync mode needs at least one server (--servers 0 is for --mode collective)"),
    (["--servers", "-1"], "--servers -1: must be >= 0"),
    (["--mode", "hybrid", "--servers", "0"], "--servers 0: hybrid mode needs at least one server"),
    (["--mode", "collective"], "--servers 2: --mode collective has no parameter servers"),
    (["--mode", "collective", "--servers", None, "--collective-port", "0"],
     "--collective-port 0: expected a port number 1..65535"),
    (["--mode", "hybrid", "--collective-port", "http"], "--collective-port http: expected a port number 1..65535"),
    (["--collective-port", "29500"], "--collective-port 29500: only with --mode collective or hybrid"),
    (["--mode", "collective", "--servers", None, "--port", "7000"],
     "--port 7000: --mode collective has no servers to listen on it"),
    (["--mode", "collective", "--servers", None, "--create-secret", True],
     "--create-secret: --mode collective has no servers, and the secret only secures connections to servers"),
    (["--mode", "collective", "--servers", None, "--insecure", True], "--insecure: --mode collective has no servers"),
    (["--mode", "collective", "--servers", None, "--existing-secret", True],
     "--existing-secret: --mode collective has no servers"),
    (["--create-secret", True, "--insecure", True], "argument --insecure: not allowed with argument --create-secret"),
    (["--existing-secret", True, "--insecure", True],
     "argument --insecure: not allowed with argument --existing-secret"),
    (["--trainers", "two"], "--trainers two: not a whole number"),
    (["--memory", "lots"], "--memory 'lots': not a positive Kubernetes quantity"),
    (["--cpu", "0"], "--cpu '0': not a positive Kubernetes quantity"),
    (["--cpu", "1.5 cores"], "--cpu '1.5 cores': not a positive Kubernetes quantity"),
    (["--name", "My_Job"], "--name 'My_Job': must be at most 45 lowercase letters"),
    (["--name", "9lives"], "starting with a letter"),
    (["--name", "x" * 46], "at most 45"),
    (["--namespace", "Team.A"], "--namespace 'Team.A': not a Kubernetes namespace name"),
    (["--port", "70000"], "--port 70000: expected a port number 1..65535"),
    (["--timeout", "-1"], "--timeout -1: must be a finite number > 0 seconds"),
    (["--mode", "eventual"], "argument --mode: invalid choice: 'eventual'"),
])
def test_bad_flags_are_a_clear_error(capsys, flags, message):
    base = {"--servers": "2", "--trainers": "2", "--image": "img"}
    for name, value in zip(flags[::2], flags[1::2]):
        base[name] = value      # None: the flag left out; True: a switch
    words = [word for name, value in base.items() if value is not None
             for word in ((name,) if value is True else (name, value))]
    code, out, err = k8s(capsys, *words, "train.py")
    assert code == 2
    assert out == ""
    assert "paramshard k8s: error: " in err and message in err, err


def test_bad_name_suggests_a_good_one(capsys):
    code, _, err = k8s(capsys, "--servers", "1", "--trainers", "1", "--image", "img", "--name", "My_Job", "t.py")
    assert code == 2 and "try --name my-job" in err


# -- Pod Security "restricted" -------------------------------------------------------------
# Pod Security Standards, Kubernetes 1.32: "restricted" is "baseline" plus the rules after it.
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                   "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(template: dict) -> list[str]:
    """What Pod Security "restricted" refuses in a pod template (metadata + spec): [] if nothing."""
    pod, annotations = template["spec"], template.get("metadata", {}).get("annotations", {})
    pod_sc = pod.get("securityContext", {})
    containers = [*pod.get("initContainers", []), *pod["containers"], *pod.get("ephemeralContainers", [])]
    bad = []
    # baseline
    bad += [f"{field} is true" for field in ("hostNetwork", "hostPID", "hostIPC") if pod.get(field)]
    bad += [f"volume {v['name']} is {sorted(set(v) - {'name'})}" for v in pod.get("volumes", [])
            if not set(v) - {"name"} <= ALLOWED_VOLUMES]        # restricted; hostPath already fails baseline
    bad += [f"sysctl {s['name']} is unsafe" for s in pod_sc.get("sysctls", []) if s["name"] not in SAFE_SYSCTLS]
    bad += [f"annotation {k}={v}" for k, v in annotations.items()
            if (k.startswith("container.apparmor.security.beta.kubernetes.io/") and v == "unconfined")
            or (k.startswith("seccomp.security.alpha.kubernetes.io/") and "unconfined" in v)]
    for where, sc in [("pod", pod_sc), *((c["name"], c.get("securityContext", {})) for c in containers)]:
        if sc.get("windowsOptions", {}).get("hostProcess"):
            bad.append(f"{where}: windowsOptions.hostProcess")
        if sc.get("appArmorProfile", {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            bad.append(f"{where}: appArmorProfile {sc['appArmorProfile']}")
        selinux = sc.get("seLinuxOptions", {})
        if selinux.get("type") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            bad.append(f"{where}: seLinuxOptions {selinux}")
        if sc.get("runAsUser") == 0:
            bad.append(f"{where}: runAsUser 0")                 # restricted
        if sc.get("seccompProfile", {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            bad.append(f"{where}: seccompProfile {sc['seccompProfile']}")
    for c in containers:
        sc, name = c.get("securityContext", {}), c["name"]
        caps = sc.get("capabilities", {})
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        bad += [f"{name}: hostPort {p['hostPort']}" for p in c.get("ports", []) if p.get("hostPort")]
        if sc.get("procMount") not in (None, "Default"):
            bad.append(f"{name}: procMount {sc['procMount']}")
        # restricted
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds capabilities {caps['add']}")
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: does not drop ALL capabilities")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            bad.append(f"{name}: runAsNonRoot is not true (pod or container)")
        if sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type") not in ("RuntimeDefault",
                                                                                         "Localhost"):
            bad.append(f"{name}: seccompProfile is not RuntimeDefault or Localhost (pod or container)")
    return bad


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d["spec"]["template"] for d in docs if d["kind"] in ("StatefulSet", "Job")}


@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
def test_every_pod_meets_pod_security_restricted(capsys, flags):
    templates = pod_templates(rendered(capsys, flags))
    assert set(templates) == ({"Job"} if "collective" in flags else {"StatefulSet", "Job"})
    for kind, template in templates.items():
        assert restricted_violations(template) == [], kind
        # The user the kubelet checks runAsNonRoot against: numeric, not root, the image's own.
        sc = template["spec"]["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == sc["runAsGroup"] == sc["fsGroup"] == RUN_AS_ID


@pytest.mark.parametrize("break_it, rule", [
    (lambda pod, c: [pod["securityContext"].pop("runAsNonRoot"), c["securityContext"].pop("runAsNonRoot")],
     "runAsNonRoot is not true"),
    (lambda pod, c: c["securityContext"].update(runAsNonRoot=False), "runAsNonRoot is not true"),
    (lambda pod, c: pod["securityContext"].update(runAsUser=0), "runAsUser 0"),
    (lambda pod, c: c["securityContext"].pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation"),
    (lambda pod, c: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "adds capabilities"),
    (lambda pod, c: c["securityContext"]["capabilities"].update(drop=["NET_RAW"]), "does not drop ALL"),
    (lambda pod, c: pod["securityContext"].pop("seccompProfile"), "seccompProfile is not RuntimeDefault"),
    (lambda pod, c: c["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccompProfile"),
    (lambda pod, c: c["securityContext"].update(privileged=True), "privileged"),
    (lambda pod, c: pod.update(hostNetwork=True), "hostNetwork is true"),
    (lambda pod, c: pod.update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "volume h is ['hostPath']"),
    (lambda pod, c: c["ports"].append({"containerPort": 80, "hostPort": 80}), "hostPort 80"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_the_pod_security_check_catches_each_rule(capsys, break_it, rule):
    """The check above has teeth: a manifest that breaks one rule fails it, naming the rule."""
    template = copy.deepcopy(pod_templates(rendered(capsys, FLAG_SETS["defaults"]))["StatefulSet"])
    break_it(template["spec"], template["spec"]["containers"][0])
    violations = restricted_violations(template)
    assert any(rule in v for v in violations), violations


def test_image_runs_as_the_pods_non_root_user():
    """runAsNonRoot with the image's own user: the Dockerfile makes uid and gid RUN_AS_ID and ends as it."""
    text = (Path(__file__).resolve().parents[4] / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)\s*$", text, re.M)
    assert users and users[-1] == f"{RUN_AS_ID}:{RUN_AS_ID}"
    assert re.search(rf"useradd\b[^\n]*--uid {RUN_AS_ID} --gid {RUN_AS_ID}\b", text)
    assert re.search(rf"groupadd --gid {RUN_AS_ID}\b", text)


# -- NetworkPolicies ------------------------------------------------------------------------
def selects(selector: dict, pod_labels: dict) -> bool:
    return selector["matchLabels"].items() <= pod_labels.items()


def admitted(policy: dict, from_labels: dict, port: int) -> bool:
    """An ingress policy's verdict on a connection from a pod of this namespace to ``port``."""
    for rule in policy["spec"]["ingress"]:
        peers_ok = any(selects(peer["podSelector"], from_labels) and "namespaceSelector" not in peer
                       for peer in rule["from"])
        ports_ok = "ports" not in rule or any(p["port"] == port and p["protocol"] == "TCP" for p in rule["ports"])
        if peers_ok and ports_ok:
            return True
    return False


@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
def test_network_policies_admit_only_the_jobs_own_pods(capsys, flags):
    kinds = by_kind(rendered(capsys, flags))
    job_labels = kinds["Job"]["spec"]["template"]["metadata"]["labels"]
    stranger = {**job_labels, "app.kubernetes.io/instance": "another-job"}
    policies = [kinds[k] for k in ("NetworkPolicy", TRAINER_POLICY) if k in kinds]
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies)
    if "StatefulSet" in kinds:
        policy, sts = kinds["NetworkPolicy"], kinds["StatefulSet"]
        server_labels = sts["spec"]["template"]["metadata"]["labels"]
        port = sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        assert selects(policy["spec"]["podSelector"], server_labels)
        assert not selects(policy["spec"]["podSelector"], job_labels)
        # Trainers and peer servers reach the servers' port; nothing else, and no other port.
        assert admitted(policy, job_labels, port) and admitted(policy, server_labels, port)
        assert not admitted(policy, stranger, port) and not admitted(policy, {}, port)
        assert not admitted(policy, job_labels, port + 1)
    else:
        assert "NetworkPolicy" not in kinds
    if "collective" in flags or "hybrid" in flags:
        policy = kinds[TRAINER_POLICY]
        store = int(kinds["Job"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"])
        assert selects(policy["spec"]["podSelector"], job_labels)
        # Trainer 0's store and gloo's ephemeral ports, from the job's trainers only.
        assert admitted(policy, job_labels, store) and admitted(policy, job_labels, 41234)
        assert not admitted(policy, stranger, store)
        if "StatefulSet" in kinds:
            assert not admitted(policy, kinds["StatefulSet"]["spec"]["template"]["metadata"]["labels"], store)
    else:
        assert TRAINER_POLICY not in kinds       # trainers listen on nothing


# -- script arguments reach the script as written ---------------------------------------------
def kubelet_expand(text: str, environ: Mapping[str, str]) -> str:
    """What the kubelet makes of a container's command and args word (Kubernetes' documented rule,
    as in k8s.io/kubernetes third_party/forked/golang/expansion): $(VAR) becomes VAR's value when
    the container defines VAR and stays as written when not; $$ becomes $ (so $$(VAR) is the
    literal $(VAR)); any other $ stays."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            following = text[i + 1]
            if following == "$":
                out.append("$")
                i += 2
                continue
            if following == "(":
                close = text.find(")", i + 2)
                if close != -1:
                    name = text[i + 2:close]
                    out.append(environ[name] if name in environ else f"$({name})")
                    i = close + 1
                    continue
            out.append("$" + following)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("word, expanded", [
    ("$(X)", "x-value"), ("a$(X)b", "ax-valueb"), ("$(UNDEFINED)", "$(UNDEFINED)"), ("$$(X)", "$(X)"),
    ("$$", "$"), ("$$$$", "$$"), ("$", "$"), ("a$b", "a$b"), ("$(X", "$(X"), ("$$$(X)", "$x-value"),
])
def test_kubelet_expansion_follows_the_documented_rule(word, expanded):
    assert kubelet_expand(word, {"X": "x-value"}) == expanded


TRICKY_ARGS = ["$(PARAMSHARD_SECRET)", "$(X)", "$$", "$$(X)", "a$b", "$", "$(", "cost: $5", "$(UNDEFINED)",
               "--note=$(PARAMSHARD_JOB_ID)"]


@pytest.mark.parametrize("target", [["train$(X).py"], ["-m", "pkg.train"]], ids=["script", "module"])
def test_script_arguments_reach_the_script_literally(capsys, target):
    """The kubelet would replace $(PARAMSHARD_SECRET) in an argument by the secret itself, and
    $$ by $: the manifests escape every $, so the expanded command is the one asked for."""
    docs = rendered(capsys, ["--servers", "2", "--trainers", "2", "--image", "img", *target, *TRICKY_ARGS])
    kinds, secrets = by_kind(docs), secrets_of(docs)
    pods = {"StatefulSet": server_pod(kinds["StatefulSet"], 0, "10.1.0.1"),
            "Job": trainer_pod(kinds["Job"], 0, "10.2.0.1")}
    for kind, pod in pods.items():
        container = kinds[kind]["spec"]["template"]["spec"]["containers"][0]
        environ = {**pod_environ(container, pod, secrets), "X": "expanded"}
        argv = [kubelet_expand(w, environ) for w in container["command"] + container["args"]]
        assert argv == ["paramshard", "run", "--servers", "2", *target, *TRICKY_ARGS]
        assert environ["PARAMSHARD_SECRET"] not in " ".join(argv)
