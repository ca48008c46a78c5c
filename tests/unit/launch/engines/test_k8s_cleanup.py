"""k8s_cleanup.delete_job_objects against a fake Kubernetes API server on 127.0.0.1.

The fake records every request (method, path, headers, body) and answers with the
status a test gives it per path; over HTTPS it serves a self-signed certificate
that the fake service-account directory holds as ca.crt, as a cluster does.
"""
from __future__ import annotations

import http.server
import json
import logging
import shutil
import ssl
import subprocess
import threading
import time

import pytest

from paramshard.launch.engines.k8s_cleanup import delete_job_objects

NS = "ml-team"
TARGETS = "services/ctr-job-server,statefulsets/ctr-job-server"
SERVICE_PATH = f"/api/v1/namespaces/{NS}/services/ctr-job-server"
STATEFULSET_PATH = f"/apis/apps/v1/namespaces/{NS}/statefulsets/ctr-job-server"


class FakeKubernetesApi:
    """A recording stand-in for the API server: ``statuses`` maps a path to the HTTP
    status it answers (default 200); ``delay`` seconds before each answer."""

    def __init__(self, statuses: dict[str, int] | None = None, delay: float = 0.0,
                 tls: ssl.SSLContext | None = None):
        self.requests: list[dict] = []
        self.statuses = statuses or {}
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_DELETE(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fake.requests.append({"method": "DELETE", "path": self.path, "headers": dict(self.headers),
                                      "body": json.loads(body) if body else None})
                time.sleep(delay)
                status = fake.statuses.get(self.path, 200)
                reply = json.dumps({"kind": "Status", "apiVersion": "v1", "code": status,
                                    "message": f"fake says {status} to {self.path}"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> "FakeKubernetesApi":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@pytest.fixture
def account(tmp_path):
    """A service-account directory as Kubernetes mounts it."""
    d = tmp_path / "serviceaccount"
    d.mkdir()
    (d / "token").write_text("tok-123\n")
    (d / "namespace").write_text(NS)
    return d


def in_cluster(port: int, **extra) -> dict[str, str]:
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port),
            "PARAMSHARD_K8S_DELETE": TARGETS, **extra}


def test_not_in_a_cluster_does_nothing(account):
    assert delete_job_objects({}, service_account_dir=account) is None
    assert delete_job_objects({"PARAMSHARD_K8S_DELETE": TARGETS}, service_account_dir=account) is None
    assert delete_job_objects({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, service_account_dir=account) is None


def test_deletes_service_then_statefulset_with_the_token(account):
    with FakeKubernetesApi() as api:
        summary = delete_job_objects(in_cluster(api.port), base_url=api.url, service_account_dir=account)
    assert [(r["method"], r["path"]) for r in api.requests] == [("DELETE", SERVICE_PATH),
                                                                ("DELETE", STATEFULSET_PATH)]
    for r in api.requests:
        assert r["headers"]["Authorization"] == "Bearer tok-123"
        assert r["headers"]["Content-Type"] == "application/json"
        assert r["body"] == {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    assert summary == ("deleted services/ctr-job-server (HTTP 200); "
                       "deleted statefulsets/ctr-job-server (HTTP 200)")


def test_namespace_variable_wins_over_the_account_file(account):
    with FakeKubernetesApi() as api:
        delete_job_objects(in_cluster(api.port, PARAMSHARD_K8S_NAMESPACE="other"), base_url=api.url,
                           service_account_dir=account)
    assert [r["path"] for r in api.requests] == ["/api/v1/namespaces/other/services/ctr-job-server",
                                                 "/apis/apps/v1/namespaces/other/statefulsets/ctr-job-server"]


def test_api_url_variable_is_the_test_override(account):
    with FakeKubernetesApi() as api:
        summary = delete_job_objects(in_cluster(1, PARAMSHARD_K8S_API_URL=api.url), service_account_dir=account)
    assert len(api.requests) == 2 and summary.startswith("deleted")


def test_already_deleted_is_fine_and_refusals_are_reported_not_raised(account, caplog):
    statuses = {SERVICE_PATH: 404, STATEFULSET_PATH: 403}
    # Straight to caplog: the "paramshard" logger stops propagating once a test configured it.
    logger = logging.getLogger("paramshard.k8s")
    logger.addHandler(caplog.handler)
    try:
        with FakeKubernetesApi(statuses) as api:
            summary = delete_job_objects(in_cluster(api.port), base_url=api.url, service_account_dir=account)
    finally:
        logger.removeHandler(caplog.handler)
    assert "services/ctr-job-server already gone" in summary
    assert f"statefulsets/ctr-job-server: HTTP 403 fake says 403 to {STATEFULSET_PATH}" in summary
    assert any(r.levelname == "ERROR" and "kubectl delete" in r.getMessage() for r in caplog.records)


@pytest.mark.slow_unit(reason="waits out the cleanup's 1 s deadline")
def test_unreachable_api_server_is_reported_within_the_deadline(account):
    started = time.monotonic()
    with FakeKubernetesApi(delay=5) as api:          # answers too late
        summary = delete_job_objects(in_cluster(api.port), base_url=api.url, timeout=1,
                                     service_account_dir=account)
    assert time.monotonic() - started < 4
    assert "services/ctr-job-server: API server" in summary
    assert "statefulsets/ctr-job-server: not attempted, the cleanup's deadline passed" in summary


def test_nothing_listening_and_bad_targets_do_not_raise(account):
    summary = delete_job_objects(in_cluster(1, PARAMSHARD_K8S_DELETE="services/x,pods/y,statefulsets"),
                                 base_url="http://127.0.0.1:1", service_account_dir=account)
    assert "services/x: API server http://127.0.0.1:1 unreachable" in summary
    assert "pods/y: not understood" in summary and "statefulsets: not understood" in summary


def test_no_namespace_anywhere_is_reported(tmp_path):
    summary = delete_job_objects(in_cluster(1), base_url="http://127.0.0.1:1", service_account_dir=tmp_path)
    assert summary.startswith("cleanup skipped: no namespace")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a test certificate")
def test_in_cluster_https_checks_the_cluster_ca(account, tmp_path):
    """The real path: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, verified with ca.crt."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with FakeKubernetesApi(tls=tls) as api:
        unverified = delete_job_objects(in_cluster(api.port), service_account_dir=account)
        shutil.copy(cert, account / "ca.crt")
        verified = delete_job_objects(in_cluster(api.port), service_account_dir=account)
    # Without the cluster's CA the certificate is not trusted: nothing is sent.
    assert "CERTIFICATE_VERIFY_FAILED" in unverified and "unreachable" in unverified
    assert verified.startswith("deleted services/ctr-job-server")
    assert [r["path"] for r in api.requests] == [SERVICE_PATH, STATEFULSET_PATH]
    assert all(r["headers"]["Authorization"] == "Bearer tok-123" for r in api.requests)
