"""Kubernetes manifests for one paramshard job (`paramshard k8s`): pure data, no cluster access.

What ``render_manifests`` returns, in the order ``kubectl apply`` should create it:

* a ServiceAccount, Role and RoleBinding that let the server pods delete their own
  StatefulSet and Services, and nothing else (see k8s_cleanup.py: a StatefulSet restarts
  any pod that exits, so "the servers end when the job ends" needs the objects gone);
* the Secret holding PARAMSHARD_SECRET, the key of every connection to a server, generated
  (the default; not with ``--existing-secret``, whose Secret is made by hand, nor with
  ``--insecure``; collective mode has no servers, so no secret either);
* NetworkPolicies: only the job's own pods reach the servers' port, and (collective,
  hybrid) only the trainers reach the trainers (trainer 0's store and gloo's ports);
* a headless Service giving every server pod a stable DNS name;
* collective and hybrid modes: a headless Service giving every trainer pod a stable DNS
  name (the pod template's ``subdomain``), so trainer 0, which hosts the trainers'
  torch.distributed store, is reachable at a name known before any pod exists;
* a StatefulSet of S servers, server id = the pod index;
* an Indexed Job of T trainers, trainer id = the completion index.

Collective mode has no servers (S = 0): no StatefulSet, no server Service and no RBAC
(nothing is left running that needs deleting; the trainers' Service stays with the Job).

Every pod gets the environment contract (paramshard/env.py); the values that only the
cluster knows (pod index, completion index, pod IP, namespace) come from the downward API.

Secure by default: pods with servers always read PARAMSHARD_SECRET from a Secret (a pod
whose Secret is missing does not start), unless ``--insecure`` says otherwise, which then
shows in every pod as PARAMSHARD_INSECURE=1. Every pod meets the Pod Security "restricted"
profile: non-root (uid RUN_AS_ID, the Dockerfile's user), no privilege escalation, no
capabilities, the runtime's default seccomp profile, no host namespaces, ports or volumes.
"""
from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import yaml

from paramshard.env import DEFAULT_TIMEOUT, MODES, check_server_count
from paramshard.errors import ConfigError
from paramshard.settings.fields import field_name, with_fields
from paramshard.settings.setting import K8S
from paramshard.settings.table import in_scope
from paramshard.launch.api import MALLOC_TUNABLES
from paramshard.launch.rank.target import check as check_target, command_words
from paramshard.mode import Mode

DEFAULT_PORT = 6174
# Where trainer 0 hosts the trainers' store in collective and hybrid modes (torch's usual port).
DEFAULT_COLLECTIVE_PORT = 29500
SECRET_KEY = "secret"
INSECURE_VARIABLE = "PARAMSHARD_INSECURE"
# The pods' user and group: the Dockerfile's `paramshard` user (uid and gid 10001). Pod Security
# "restricted" needs runAsNonRoot, which the kubelet can only verify for a numeric user.
RUN_AS_ID = 10001
# The downward-API fields the pods read (tests substitute them to "run" a pod).
POD_INDEX_FIELD = "metadata.labels['apps.kubernetes.io/pod-index']"
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
POD_IP_FIELD = "status.podIP"
NAMESPACE_FIELD = "metadata.namespace"

# A StatefulSet labels each pod's revision "NAME-server-<hash of up to 10 characters>";
# a label value holds at most 63, so NAME may have 63 - len("-server-") - 10 = 45.
MAX_NAME = 45
# Service names are DNS-1035 labels (a letter first), the strictest of the names derived from NAME.
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes resource quantities: a non-negative number with an optional SI, binary or exponent suffix.
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")


if TYPE_CHECKING:    # the fields the table adds, for the checker (settings/stubs.py); object at run time
    from paramshard.settings.config_fields import K8sJobSpecFields
else:
    K8sJobSpecFields = object


@dataclasses.dataclass(frozen=True)
@with_fields(K8S)
class K8sJobSpec(K8sJobSpecFields):
    """One job's manifests; every field is a `paramshard k8s` flag (errors name the flag). Settings of
    scope K8S (settings/contract.py) not written below are fields too, generated, and go into every
    pod's environment as the contract writes them (``_settings_env``)."""
    script: str | None             # a path inside the image, or None with a module
    image: str
    servers: int
    trainers: int
    script_args: tuple[str, ...] = ()
    module: str | None = None      # run as python -m, importable in the image
    name: str = "paramshard"
    namespace: str = "default"
    mode: str = "sync"
    port: int = DEFAULT_PORT
    timeout: float = DEFAULT_TIMEOUT
    cpu: str = "1"
    memory: str = "2Gi"
    cluster_domain: str = "cluster.local"
    collective_port: int = DEFAULT_COLLECTIVE_PORT   # collective, hybrid: trainer 0's store
    # Where the servers' PARAMSHARD_SECRET comes from: exactly one of these with servers, none without.
    # The value of the generated Secret in the output (the default, --create-secret):
    secret: str | None = dataclasses.field(default=None, repr=False)
    existing_secret: bool = False   # --existing-secret: Secret NAME-secret, made by hand
    insecure: bool = False          # --insecure: no secret, plain TCP, PARAMSHARD_INSECURE=1

    def __post_init__(self):
        check_target(self.script, self.module)
        if self.mode not in MODES:
            raise ConfigError(f"--mode {self.mode!r}: expected one of {', '.join(MODES)}")
        check_server_count(self.mode, self.servers)
        if self.trainers < 1:
            raise ConfigError(f"--trainers {self.trainers}: need at least 1 trainer")
        if not _DNS_1035.match(self.name) or len(self.name) > MAX_NAME:
            raise ConfigError(f"--name {self.name!r}: must be at most {MAX_NAME} lowercase letters, digits "
                              f"and '-', starting with a letter and ending with a letter or digit, "
                              f"as it names Kubernetes objects (try --name {_suggest_name(self.name)})")
        if not _DNS_1123_LABEL.match(self.namespace) or len(self.namespace) > 63:
            raise ConfigError(f"--namespace {self.namespace!r}: not a Kubernetes namespace name "
                              f"(lowercase letters, digits and '-', at most 63)")
        if not _DNS_SUBDOMAIN.match(self.cluster_domain) or len(self.cluster_domain) > 253:
            raise ConfigError(f"--cluster-domain {self.cluster_domain!r}: not a DNS domain")
        if not self.image or any(c.isspace() for c in self.image):
            raise ConfigError(f"--image {self.image!r}: expected an image reference such as "
                              f"registry.example.com/paramshard:0.1.0")
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port}: expected 1..65535")
        if not 1 <= self.collective_port <= 65535:
            raise ConfigError(f"--collective-port {self.collective_port}: expected 1..65535")
        chosen = [flag for flag, on in (("--create-secret", self.secret is not None),
                                        ("--existing-secret", self.existing_secret),
                                        ("--insecure", self.insecure)) if on]
        if chosen and not self.uses_secret:
            raise ConfigError(f"{chosen[0]}: --mode collective has no servers, and the secret only secures "
                              f"connections to servers (the trainers' store and gloo traffic are plain TCP); "
                              f"drop {chosen[0]}")
        if len(chosen) > 1:
            raise ConfigError(f"{' and '.join(chosen)}: give only one (where the servers' secret comes from)")
        if self.uses_secret and not chosen:
            raise ConfigError("servers need PARAMSHARD_SECRET: generate a Secret (the default of `paramshard "
                              "k8s`), use one made by hand (--existing-secret), or run without (--insecure)")
        if self.secret == "":
            raise ConfigError("--create-secret: the generated secret is empty")
        if not self.timeout > 0:
            raise ConfigError(f"--timeout {self.timeout}: must be > 0 seconds")
        for flag, value, example in (("--cpu", self.cpu, "500m, 2"), ("--memory", self.memory, "512Mi, 4Gi")):
            if not _QUANTITY.match(value) or _is_zero(value):
                raise ConfigError(f"{flag} {value!r}: not a positive Kubernetes quantity (e.g. {example})")

    # -- names every object and pod agrees on ---------------------------------
    @property
    def server_name(self) -> str:
        """The headless Service, the StatefulSet and its ServiceAccount."""
        return f"{self.name}-server"

    @property
    def trainer_name(self) -> str:
        """The Indexed Job: the Job controller names trainer I's host TRAINER_NAME-I."""
        return f"{self.name}-trainer"

    @property
    def collective(self) -> bool:
        """The trainers form a torch.distributed group that trainer 0's store brings together."""
        return Mode.parse(self.mode).allreduce

    @property
    def trainer_service_name(self) -> str:
        """The trainers' headless Service, their pods' subdomain (collective, hybrid)."""
        return f"{self.name}-trainers"

    @property
    def collective_address(self) -> str:
        """Trainer 0's stable DNS name and the store's port: host TRAINER_NAME-0 (the Indexed
        Job's hostname for completion index 0) in the subdomain of the trainers' Service."""
        return (f"{self.trainer_name}-0.{self.trainer_service_name}.{self.namespace}.svc."
                f"{self.cluster_domain}:{self.collective_port}")

    @property
    def uses_secret(self) -> bool:
        """PARAMSHARD_SECRET keys the connections to servers (CurveZMQ); without servers nothing uses it."""
        return self.servers > 0

    @property
    def reads_secret(self) -> bool:
        """The pods read PARAMSHARD_SECRET from Secret NAME-secret (generated or made by hand)."""
        return self.uses_secret and not self.insecure

    @property
    def secret_name(self) -> str:
        return f"{self.name}-secret"

    @property
    def cleanup_role_name(self) -> str:
        return f"{self.name}-server-cleanup"

    def server_address(self, index: int) -> str:
        """A server's stable DNS name (StatefulSet pod NAME-server-I under its headless Service)."""
        return (f"{self.server_name}-{index}.{self.server_name}.{self.namespace}.svc."
                f"{self.cluster_domain}:{self.port}")

    @property
    def server_addresses(self) -> tuple[str, ...]:
        return tuple(self.server_address(i) for i in range(self.servers))

    @property
    def cleanup_services(self) -> tuple[str, ...]:
        """The Services server 0 deletes: its own, and in hybrid mode the trainers' (their
        store is long unused when the servers end, after the last trainer left)."""
        if self.collective:
            return (self.trainer_service_name, self.server_name)
        return (self.server_name,)

    @property
    def cleanup_targets(self) -> str:
        # The Services first: deleting the StatefulSet ends the very pod that sends the requests.
        return ",".join([*(f"services/{s}" for s in self.cleanup_services), f"statefulsets/{self.server_name}"])


def _is_zero(quantity: str) -> bool:
    number = re.match(r"^[\d.]+", quantity)
    return number is not None and float(number.group() or 0) == 0


def _suggest_name(name: str) -> str:
    fixed = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    fixed = re.sub(r"^[^a-z]+", "", fixed)[:MAX_NAME].rstrip("-")
    return fixed or "paramshard"


def job_labels(spec: K8sJobSpec) -> dict[str, str]:
    """What every pod of this job carries, servers and trainers."""
    return {"app.kubernetes.io/name": "paramshard", "app.kubernetes.io/instance": spec.name}


def labels(spec: K8sJobSpec, component: str) -> dict[str, str]:
    return {**job_labels(spec), "app.kubernetes.io/component": component}


def _metadata(spec: K8sJobSpec, name: str, component: str) -> dict:
    return {"name": name, "namespace": spec.namespace, "labels": labels(spec, component)}


def _field(path: str) -> dict:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(entries: list[tuple[str, str | dict]]) -> list[dict]:
    return [{"name": name, "value": value} if isinstance(value, str) else {"name": name, **value}
            for name, value in entries]


def _common_env(spec: K8sJobSpec, container: str) -> list[tuple[str, str | dict]]:
    """The contract every pod of the job shares, in `paramshard env`'s order."""
    secret: list[tuple[str, str | dict]]
    if spec.reads_secret:
        # Not optional: a pod whose Secret (or key) is missing does not start, it never runs without.
        secret = [("PARAMSHARD_SECRET", {"valueFrom": {"secretKeyRef": {
            "name": spec.secret_name, "key": SECRET_KEY, "optional": False}}})]
    elif spec.insecure:
        secret = [(INSECURE_VARIABLE, "1")]     # plain TCP, chosen explicitly
    else:
        secret = []                             # collective: nothing reads a secret
    return [
        ("PARAMSHARD_SERVERS", ",".join(spec.server_addresses)),     # "" in collective mode
        ("PARAMSHARD_TRAINERS", str(spec.trainers)),
        ("PARAMSHARD_MODE", spec.mode),
        ("PARAMSHARD_TIMEOUT", f"{spec.timeout:g}"),
        # Every pod derives the CurveZMQ keys from the secret and this id: they must agree.
        ("PARAMSHARD_JOB_ID", spec.name),
        *secret,
        *_settings_env(spec),
        ("PYTHONUNBUFFERED", "1"),          # log lines reach `kubectl logs` as they are written
        ("GLIBC_TUNABLES", MALLOC_TUNABLES),  # as the local launcher sets it (launch/api.py says why)
        # torch sizes its thread pool by the node's cores, not the container's CPU limit; a pool
        # wider than the limit is throttled. The limit rounded up to whole cores:
        ("OMP_NUM_THREADS", {"valueFrom": {"resourceFieldRef": {
            "containerName": container, "resource": "limits.cpu", "divisor": "1"}}}),
    ]


# Written by hand above: their manifest form is not the contract's (timeout as %g, the secret's source).
_WRITTEN_HERE = ("trainers", "mode", "timeout", "insecure")


def _settings_env(spec: K8sJobSpec) -> list[tuple[str, str]]:
    """The other K8S settings (generated fields), as ``ClusterEnv.to_environ`` writes them."""
    out: list[tuple[str, str]] = []
    for setting in in_scope(K8S):
        name = field_name(setting, K8S)
        if name not in _WRITTEN_HERE:
            out += setting.environ(getattr(spec, name), spec).items()
    return out


def literal(word: str) -> str:
    """A command or args word the kubelet passes on as written: it replaces $(VAR) by the
    container's variable VAR (so a script argument "$(PARAMSHARD_SECRET)" would become the
    secret) and $$ by $; with every $ doubled, only the second rule applies."""
    return word.replace("$", "$$")


def _container(spec: K8sJobSpec, role: str, env: list[tuple[str, str | dict]], ports: list[dict]) -> dict:
    # One command for both roles, as under mpirun: PARAMSHARD_ROLE picks serving or training,
    # and `paramshard run`'s server path deletes the job's server objects at the end.
    argv = [literal(word) for word in ["paramshard", "run", "--servers", str(spec.servers),
                                       *command_words(spec.script, spec.module, spec.script_args)]]
    resources = {"cpu": spec.cpu, "memory": spec.memory}
    container = {
        "name": role,
        "image": spec.image,
        "command": argv[:1],
        "args": argv[1:],
        "env": _env(_common_env(spec, role) + env),
        # Requests = limits: the scheduler reserves what the pod may use, and a pod over its
        # memory is OOM-killed (a clear failure) instead of squeezing its neighbours.
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        # Pod Security "restricted", per container as well (the pod's settings cover the rest).
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "privileged": False, "runAsNonRoot": True},
    }
    if ports:
        container["ports"] = ports
    return container


def _pod_spec(spec: K8sJobSpec, container: dict, restart_policy: str, service_account: str | None,
              subdomain: str | None = None) -> dict:
    pod: dict = {"restartPolicy": restart_policy}
    if subdomain:
        # With the pod's hostname (an Indexed Job sets JOB-INDEX) this makes the DNS name
        # HOSTNAME.SUBDOMAIN.NAMESPACE.svc.DOMAIN, also written to the pod's own /etc/hosts.
        pod["subdomain"] = subdomain
    if service_account:
        pod["serviceAccountName"] = service_account
    else:
        pod["automountServiceAccountToken"] = False    # trainers never talk to the API server
    # The contract is all a pod needs; Service links would add variables for every Service.
    pod["enableServiceLinks"] = False
    # Pod Security "restricted": a numeric non-root user (the image's, see Dockerfile), which
    # also owns the volumes a user adds (fsGroup); the runtime's default seccomp profile.
    pod["securityContext"] = {"runAsNonRoot": True, "runAsUser": RUN_AS_ID, "runAsGroup": RUN_AS_ID,
                              "fsGroup": RUN_AS_ID, "seccompProfile": {"type": "RuntimeDefault"}}
    pod["containers"] = [container]
    return pod


def service_account_docs(spec: K8sJobSpec) -> list[dict]:
    """Just enough for a server to delete its own StatefulSet and the Services (k8s_cleanup.py)."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": _metadata(spec, spec.server_name, "server")}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": _metadata(spec, spec.cleanup_role_name, "server"),
        "rules": [
            {"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": [spec.server_name],
             "verbs": ["delete"]},
            {"apiGroups": [""], "resources": ["services"], "resourceNames": list(spec.cleanup_services),
             "verbs": ["delete"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": _metadata(spec, spec.cleanup_role_name, "server"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": spec.cleanup_role_name},
        "subjects": [{"kind": "ServiceAccount", "name": spec.server_name, "namespace": spec.namespace}],
    }
    return [account, role, binding]


def secret_doc(spec: K8sJobSpec) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _metadata(spec, spec.secret_name, "secret"),
            "stringData": {SECRET_KEY: spec.secret}}


def _network_policy(spec: K8sJobSpec, name: str, component: str, peers: dict, ports: list[dict] | None) -> dict:
    rule: dict = {"from": [{"podSelector": peers}]}      # no namespaceSelector: this namespace only
    if ports is not None:
        rule["ports"] = ports
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _metadata(spec, name, component),
        "spec": {"podSelector": {"matchLabels": labels(spec, component)}, "policyTypes": ["Ingress"],
                 "ingress": [rule]},
    }


def network_policy_docs(spec: K8sJobSpec) -> list[dict]:
    """Only the job's own pods reach its listening ports (where the cluster's network plugin
    enforces NetworkPolicies): the servers' port from any pod of the job (trainers and peer
    servers); in collective and hybrid modes the trainers, whose store (trainer 0) and gloo
    connections are plain TCP, from the job's trainers only, on any port (gloo listens on
    ephemeral ones)."""
    docs = []
    if spec.servers:
        docs.append(_network_policy(spec, spec.server_name, "server", {"matchLabels": job_labels(spec)},
                                    [{"protocol": "TCP", "port": spec.port}]))
    if spec.collective:
        docs.append(_network_policy(spec, spec.trainer_service_name, "trainer",
                                    {"matchLabels": labels(spec, "trainer")}, None))
    return docs


def _headless_service(spec: K8sJobSpec, name: str, component: str, port_name: str, port: int) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(spec, name, component),
        "spec": {
            "clusterIP": "None",     # headless: DNS names the pods themselves, no load balancing
            # Names resolve as soon as a pod has an IP: trainers and peer servers connect
            # (and retry) before any readiness, as they do outside Kubernetes.
            "publishNotReadyAddresses": True,
            "selector": labels(spec, component),
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def service_doc(spec: K8sJobSpec) -> dict:
    """The servers' names: NAME-server-I.NAME-server.NAMESPACE.svc.DOMAIN."""
    return _headless_service(spec, spec.server_name, "server", "paramshard", spec.port)


def trainer_service_doc(spec: K8sJobSpec) -> dict:
    """The trainers' names (collective, hybrid): NAME-trainer-I.NAME-trainers.NAMESPACE.svc.DOMAIN;
    only trainer 0's is used, by the others, to reach the store it hosts."""
    return _headless_service(spec, spec.trainer_service_name, "trainer", "collective", spec.collective_port)


def statefulset_doc(spec: K8sJobSpec) -> dict:
    env: list[tuple[str, str | dict]] = [
        ("PARAMSHARD_ROLE", "server"),
        ("PARAMSHARD_SERVER_ID", _field(POD_INDEX_FIELD)),
        # Bind the pod's own address; the others reach it by its DNS name, which resolves to it.
        ("PARAMSHARD_BIND", _field(POD_IP_FIELD)),
        ("PARAMSHARD_K8S_NAMESPACE", _field(NAMESPACE_FIELD)),
        ("PARAMSHARD_K8S_DELETE", spec.cleanup_targets),
    ]
    ports = [{"name": "paramshard", "containerPort": spec.port, "protocol": "TCP"}]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _metadata(spec, spec.server_name, "server"),
        "spec": {
            "serviceName": spec.server_name,
            "replicas": spec.servers,
            # All servers at once: each waits for its peers, so one-by-one start would deadlock.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels(spec, "server")},
            "template": {
                "metadata": {"labels": labels(spec, "server")},
                # A StatefulSet allows only Always: an exited server comes back, which is why
                # server 0 deletes the StatefulSet when the job ends (k8s_cleanup.py).
                "spec": _pod_spec(spec, _container(spec, "server", env, ports), "Always", spec.server_name),
            },
        },
    }


def job_doc(spec: K8sJobSpec) -> dict:
    env: list[tuple[str, str | dict]] = [
        ("PARAMSHARD_ROLE", "trainer"),
        ("PARAMSHARD_TRAINER_ID", _field(COMPLETION_INDEX_FIELD)),
    ]
    ports = []
    if spec.collective:
        # Trainer 0 binds this name, which resolves to its own pod IP (/etc/hosts); the
        # others connect to it, retrying until the job's timeout while it starts.
        env.append(("PARAMSHARD_COLLECTIVE_ADDR", spec.collective_address))
        ports = [{"name": "collective", "containerPort": spec.collective_port, "protocol": "TCP"}]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _metadata(spec, spec.trainer_name, "trainer"),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.trainers,
            "parallelism": spec.trainers,
            # No retries: a trainer restarted from its first step cannot rejoin the others at
            # step k, and the servers keep no checkpoint. One failed trainer fails the Job at
            # once; its pod stays for `kubectl logs`, the others are stopped.
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels(spec, "trainer")},
                "spec": _pod_spec(spec, _container(spec, "trainer", env, ports), "Never", None,
                                  spec.trainer_service_name if spec.collective else None),
            },
        },
    }


def render_manifests(spec: K8sJobSpec) -> list[dict]:
    # No servers (collective): no StatefulSet to delete, so no Service or RBAC for it either.
    docs = service_account_docs(spec) if spec.servers else []
    if spec.secret is not None:
        docs.append(secret_doc(spec))
    # Before any pod listens: the ports are closed to other pods from the start.
    docs += network_policy_docs(spec)
    if spec.servers:
        docs.append(service_doc(spec))
    if spec.collective:
        docs.append(trainer_service_doc(spec))
    if spec.servers:
        docs.append(statefulset_doc(spec))
    return docs + [job_doc(spec)]


def to_yaml(docs: list[dict]) -> str:
    """Multi-document YAML, keys in the order written (kubectl reads JSON as well)."""
    return yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, default_flow_style=False, width=120)
