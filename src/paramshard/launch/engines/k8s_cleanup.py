"""End a Kubernetes job's servers: delete their Service and StatefulSet from inside a server pod.

A StatefulSet restarts every pod that exits (its pods may only have restartPolicy
Always), so a server that simply exits when the trainers are done comes straight
back and waits for trainers that never arrive. Instead, once its job has ended, a
server deletes the objects listed in PARAMSHARD_K8S_DELETE (set by `paramshard k8s`)
through the in-cluster API, with its service account's token; the StatefulSet's
deletion then removes every server pod (propagationPolicy Background).

Standard library only (urllib + ssl): the image needs no Kubernetes client. Errors
are logged, never raised: a failed cleanup must not turn a finished job into a failed
one (the objects are then deleted by hand, `kubectl delete -f job.yaml`).
"""
from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping

from paramshard.log import get_logger
from paramshard.settings.process_variables import K8S_API_URL, K8S_DELETE, K8S_NAMESPACE

log = get_logger("k8s")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TARGETS_VARIABLE = K8S_DELETE.env         # "services/NAME,statefulsets/NAME", in order
NAMESPACE_VARIABLE = K8S_NAMESPACE.env    # from the downward API; else the service account's
# For tests only: the API server's base URL (e.g. a plain-HTTP fake on 127.0.0.1) instead of
# https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
API_URL_VARIABLE = K8S_API_URL.env

# resource (as written in PARAMSHARD_K8S_DELETE) -> its API path prefix
API_PREFIXES = {
    "services": "/api/v1",
    "statefulsets": "/apis/apps/v1",
}
DELETE_OPTIONS = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}


def delete_job_objects(environ: Mapping[str, str] = os.environ, base_url: str | None = None,
                       timeout: float = 10, service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> str | None:
    """Delete this job's objects; a one-line summary of what happened (also logged), or
    None when not in a cluster (no KUBERNETES_SERVICE_HOST or no PARAMSHARD_K8S_DELETE).

    ``timeout``: seconds for all the requests together. Never raises."""
    targets = [t.strip() for t in (K8S_DELETE.read(environ) or "").split(",") if t.strip()]
    if not environ.get("KUBERNETES_SERVICE_HOST") or not targets:
        return None
    try:
        return _delete_all(environ, targets, base_url, timeout, Path(service_account_dir))
    except Exception as exc:  # noqa: BLE001 - a cleanup failure is reported, never raised
        summary = f"cleanup failed ({type(exc).__name__}: {exc}); delete the job's objects by hand"
        log.error("%s", summary)
        return summary


def _delete_all(environ: Mapping[str, str], targets: list[str], base_url: str | None, timeout: float,
                account_dir: Path) -> str:
    namespace = K8S_NAMESPACE.read(environ) or _read(account_dir / "namespace")
    if not namespace:
        summary = (f"cleanup skipped: no namespace ({NAMESPACE_VARIABLE} unset, no "
                   f"{account_dir / 'namespace'}); delete {', '.join(targets)} by hand")
        log.error("%s", summary)
        return summary
    base = (base_url or K8S_API_URL.read(environ) or _in_cluster_url(environ)).rstrip("/")
    token = _read(account_dir / "token")
    if token is None:
        log.warning("no service account token at %s: asking the API server without one", account_dir / "token")
    context = None
    if base.startswith("https:"):
        ca = account_dir / "ca.crt"
        context = ssl.create_default_context(cafile=str(ca) if ca.is_file() else None)
    deadline = time.monotonic() + timeout
    outcomes = [_delete_one(base, namespace, target, token, context, deadline) for target in targets]
    summary = "; ".join(text for _, text in outcomes)
    if all(ok for ok, _ in outcomes):
        log.info("job cleanup: %s", summary)
    else:
        log.error("job cleanup: %s; delete the rest by hand (kubectl delete -f job.yaml)", summary)
    return summary


def _in_cluster_url(environ: Mapping[str, str]) -> str:
    host = environ["KUBERNETES_SERVICE_HOST"]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"      # an IPv6 address
    return f"https://{host}:{environ.get('KUBERNETES_SERVICE_PORT', '443')}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _delete_one(base: str, namespace: str, target: str, token: str | None, context: ssl.SSLContext | None,
                deadline: float) -> tuple[bool, str]:
    """(done, what happened): done when the object is deleted or was already gone."""
    resource, _, name = target.partition("/")
    if resource not in API_PREFIXES or not name:
        return False, f"{target}: not understood (expected one of {', '.join(f'{r}/NAME' for r in API_PREFIXES)})"
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False, f"{target}: not attempted, the cleanup's deadline passed"
    url = f"{base}{API_PREFIXES[resource]}/namespaces/{namespace}/{resource}/{name}"
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(DELETE_OPTIONS).encode(), headers=headers,
                                     method="DELETE")
    # No proxy: the API server is inside the cluster, whatever HTTPS_PROXY the pod has for the outside.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=remaining) as response:
            return True, f"deleted {target} (HTTP {response.status})"
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return True, f"{target} already gone"
        return False, f"{target}: HTTP {exc.code} {_status_message(exc)}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{target}: API server {base} unreachable ({reason})"


def _status_message(exc: urllib.error.HTTPError) -> str:
    """The API server's own words (its Status object's message), e.g. what RBAC forbade."""
    try:
        body = exc.read(4096).decode("utf-8", "replace")
    except OSError:
        return exc.reason or ""
    try:
        return json.loads(body).get("message") or body
    except (ValueError, AttributeError):
        return body.strip()[:300] or (exc.reason or "")
