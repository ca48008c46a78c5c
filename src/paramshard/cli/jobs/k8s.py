"""`paramshard k8s`: print the Kubernetes manifests of one job (docs/kubernetes.md)."""
from __future__ import annotations

import argparse
import os
import secrets
import stat
import sys
from pathlib import Path

from paramshard.errors import ConfigError
from paramshard.launch.rank import target
from paramshard.settings import argtypes
from paramshard.settings.contract import SECRET_SOURCE
from paramshard.settings.flags import add_flags, spec_fields
from paramshard.mode import Mode
from paramshard.launch.engines.k8s import (DEFAULT_COLLECTIVE_PORT, DEFAULT_PORT, SECRET_KEY, K8sJobSpec,
                           render_manifests, to_yaml)

HELP = "print Kubernetes manifests (Service, StatefulSet of servers, Indexed Job of trainers) for a job"
EXAMPLE = ("paramshard k8s --servers 2 --trainers 4 --image registry.example.com/paramshard:0.1.0 "
           "--out job.yaml examples/digits_mlp.py --epochs 4",
           "kubectl apply -f job.yaml",
           "paramshard k8s --mode collective --trainers 4 --image registry.example.com/paramshard:0.1.0 "
           "examples/digits_mlp.py > job.yaml")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", type=argtypes.count("--servers", minimum=0), default=None, metavar="N",
                   help="number of parameter servers, a StatefulSet (default 1; 0, and only 0, with "
                        "--mode collective)")
    p.add_argument("--image", required=True, help="container image with paramshard and the script (see Dockerfile)")
    p.add_argument("--name", default="paramshard", help="job name: prefixes every object and is PARAMSHARD_JOB_ID")
    p.add_argument("--namespace", default="default", help="namespace of every object")
    p.add_argument("--port", type=argtypes.port("--port"), default=None,
                   help=f"port every server listens on (default {DEFAULT_PORT})")
    p.add_argument("--collective-port", type=argtypes.port("--collective-port"), default=None, metavar="PORT",
                   help=f"collective and hybrid modes: port of the store trainer 0 hosts for the trainers' "
                        f"torch.distributed group (default {DEFAULT_COLLECTIVE_PORT})")
    p.add_argument("--cpu", default="1", help="CPU request and limit of every pod, e.g. 500m or 4")
    p.add_argument("--memory", default="2Gi", help="memory request and limit of every pod, e.g. 512Mi or 8Gi")
    p.add_argument("--cluster-domain", default="cluster.local", help="the cluster's DNS domain")
    # Where the servers' PARAMSHARD_SECRET comes from. A generated Secret is the default: one
    # `kubectl apply` runs an encrypted job, every job gets a fresh key, and `kubectl delete -f`
    # removes the key with the job; a pod never starts without its Secret.
    secret = p.add_mutually_exclusive_group()
    secret.add_argument("--create-secret", action="store_true",
                        help="the default with servers: the output includes Secret NAME-secret with a newly "
                             "generated PARAMSHARD_SECRET, so one `kubectl apply` runs an encrypted job, each job "
                             "has its own key and `kubectl delete -f` removes it; the output is then itself a "
                             "secret (--out FILE, or stdout redirected to a file, is made mode 0600; keep it out "
                             "of version control)")
    secret.add_argument("--existing-secret", action="store_true",
                        help="no Secret in the output: the pods read Secret NAME-secret (key 'secret') that you "
                             "create once per job, e.g. from a secret manager (the command is printed); the "
                             "output then holds no secret and may be committed")
    # --trainers, --mode, --timeout and --insecure (in that group): from the table (settings/).
    add_flags(p, "k8s", {SECRET_SOURCE: secret})
    p.add_argument("--out", metavar="FILE", help="write the manifests to FILE instead of stdout (mode 0600 when "
                                                 "they hold the Secret)")
    target.add_module_argument(p)
    target.no_abbreviations(p)
    p.add_argument("script", nargs="?",
                   help="the training script, a path inside the image (relative to its WORKDIR), unless -m MODULE")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def preprocess(argv: list[str]) -> list[str]:
    """`-mMODULE` and `--module=MODULE` become `-m MODULE` (see launch/rank/target.py)."""
    return target.split_attached_module(argv, add_arguments)


def run(args) -> int:
    script, module, script_args = target.from_args(args.script, args.module, args.script_args)
    servers = args.servers if args.servers is not None else (1 if Mode.parse(args.mode).has_servers else 0)
    spec = K8sJobSpec(
        **spec_fields(args), script=script, module=module, script_args=script_args, image=args.image,
        servers=servers, name=args.name, namespace=args.namespace,
        port=args.port if args.port is not None else DEFAULT_PORT,
        cpu=args.cpu, memory=args.memory, cluster_domain=args.cluster_domain,
        collective_port=args.collective_port if args.collective_port is not None else DEFAULT_COLLECTIVE_PORT,
        # Generated unless another source is chosen; with no servers only if asked (then refused).
        secret=secrets.token_hex(32) if args.create_secret or (
            servers and not args.existing_secret and not args.insecure) else None,
        existing_secret=args.existing_secret)
    # Flags that would do nothing are refused (after the spec's own checks, --servers first).
    if args.port is not None and not spec.servers:
        raise ConfigError(f"--port {args.port}: --mode collective has no servers to listen on it "
                          f"(the trainers' store is at --collective-port)")
    if args.collective_port is not None and not spec.collective:
        raise ConfigError(f"--collective-port {args.collective_port}: only with --mode collective or hybrid "
                          f"(the trainers' store); --mode {args.mode} has none")
    text = to_yaml(render_manifests(spec))
    private = spec.secret is not None          # the output holds the job's secret
    if args.out:
        try:
            if private:
                _write_private(args.out, text)
            else:
                Path(args.out).write_text(text)
        except OSError as exc:
            raise ConfigError(f"--out {args.out}: cannot write ({exc.strerror})") from None
        print(f"wrote {args.out}" + (f" (mode 0600: it holds Secret {spec.secret_name})" if private else ""),
              file=sys.stderr)
    else:
        if private:
            _make_stdout_private(spec.secret_name)     # before a byte of the secret is in it
        sys.stdout.write(text)
    # On stderr: stdout stays YAML for `> job.yaml` or `| kubectl apply -f -`.
    if spec.existing_secret:
        # `&&`: without openssl the command would make a Secret with an empty value, which
        # reads as no secret at all.
        print(f"# the pods read PARAMSHARD_SECRET from Secret {spec.secret_name} (key {SECRET_KEY!r}); "
              f"create it once per job:\n"
              f"secret=\"$(openssl rand -hex 32)\" && kubectl create secret generic {spec.secret_name} "
              f"--namespace {spec.namespace} --from-literal={SECRET_KEY}=\"$secret\"", file=sys.stderr)
    if spec.insecure:
        print("# --insecure: the servers accept any connection that reaches their port, unencrypted; "
              "the NetworkPolicy only helps where the cluster's network plugin enforces it", file=sys.stderr)
    return 0


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, also when the file existed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)        # O_CREAT's mode applies only to a new file
        f.write(text)


def _make_stdout_private(secret_name: str) -> None:
    """`paramshard k8s ... > job.yaml`: the shell made job.yaml with its umask, usually readable
    by everyone; the Secret is about to go in, so make it the owner's only."""
    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return                              # not a file descriptor (tests, embedding)
    if not stat.S_ISREG(mode) or not mode & 0o077:
        return                              # a pipe or terminal, or private already
    try:
        os.fchmod(fd, 0o600)
    except OSError as exc:
        print(f"# warning: the output holds Secret {secret_name} but its file stays readable by others "
              f"({exc.strerror}): chmod 600 it, or use --out FILE", file=sys.stderr)
