"""The HTTP front of a serving replica (`paramshard serve`): the standard library's ThreadingHTTPServer.

Endpoints (JSON in and out; every error is ``{"error": reason}`` with its status):

- ``POST /predict``: ``{"rows": [{column: value, ...}, ...]}`` (or the list alone) ->
  ``{"scores": [...], "version": {...}}``, one score per row in order (a multi-task model: a list
  per row), the version that answered (replica.py).
- ``POST /predict/batch``: either columnar rows, ``{"columns": {column: [value per row]}}`` ->
  ``{"scores": [...], "version"}``, or several requests, ``{"requests": [{"rows": [...]}, ...]}`` ->
  ``{"results": [{"scores": [...]}, ...], "version"}``: all answered by one forward, one version.
- ``GET /health``: ok (200) or not (503: a gap, a damaged file, a broken copy), the version,
  ``freshness_s`` (seconds since the newest applied file was created), errors, the last error.
- ``GET /metrics``: Prometheus text (metrics.py).

A scoring reply carries a ``Server-Timing`` header (milliseconds spent reading and parsing the
body, encoding the rows, running the model (lookups included) and writing the reply's JSON): a
client sees where its latency went, and what the server does not account for is the transport
(benchmarks/serving_requests.py reports both).

A hostile client cannot make it allocate: a body needs a Content-Length of at most ``max_body``
bytes (checked before a byte is read; no chunked bodies), at most ``max_inflight`` requests are
worked on at once (the others get 503 at once), at most MAX_CONNECTIONS are open (one more is
closed at once), a connection idle for ``timeout`` seconds is
closed, and rows are checked (serving/rows.py) before anything is made for them. It binds
loopback unless told otherwise.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:        # a request's JSON parsed in ~0.25 ms instead of ~0.65 (100 rows, 54 kB; measured)
    import orjson
except ImportError:         # an environment installed before it was a dependency: json alone
    orjson = None  # type: ignore[assignment]

from paramshard.errors import ConfigError
from paramshard.serving.metrics import ServeMetrics
from paramshard.serving.rows import MAX_ROWS, BadRequest, check_count

MAX_BODY = 4 << 20          # bytes of a request body (~40k rows of 26 features)
MAX_INFLIGHT = 16          # requests worked on at once
MAX_CONNECTIONS = 256      # open connections (threads) at once
TIMEOUT = 10.0


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS at once: one more is closed at once (each
    idle one is dropped after the front's timeout), so connections alone cannot pile up threads."""
    daemon_threads = True
    block_on_close = False
    front: "ServingFront"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request, client_address):
        if not self.connections.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"        # keep-alive: a client's requests reuse one connection
    # TCP_NODELAY: a reply's last segment waits for no ACK (with Nagle, a keep-alive client's delayed
    # ACK added ~40 ms to every reply: measured, benchmarks/serving_requests.py).
    disable_nagle_algorithm = True
    # A buffered reply: the status line, headers and body leave in one send at the request's end
    # (handle_one_request flushes; finish() flushes what an early error wrote), not two.
    wbufsize = 1 << 16
    server: _Server
    server_version = "paramshard-serve"
    timing: list | None = None           # the request's stages (Server-Timing), set by a scoring route

    def setup(self):
        self.timeout = self.server.front.timeout       # the socket's: a silent client is dropped
        super().setup()

    def handle_expect_100(self):
        # "100 Continue" goes now, not at the request's end: the client waits for it to send its body.
        ok = super().handle_expect_100()
        self.wfile.flush()
        return ok

    def log_message(self, format, *args):             # noqa: A002 - access lines go nowhere (metrics count them)
        pass

    def do_GET(self):
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")

    def _answer(self, method: str) -> None:
        front = self.server.front
        path = self.path.split("?", 1)[0]
        started = time.perf_counter()
        route = front.routes.get((method, path))
        if route is None:
            known = (method, path) in {(m, p) for m, p in front.routes} or any(p == path for _, p in front.routes)
            code, body = (405, {"error": f"{method} {path}: use {'GET' if method == 'POST' else 'POST'}"}) if known else \
                (404, {"error": f"no endpoint {path}: POST /predict, POST /predict/batch, GET /health, GET /metrics"})
            if method == "POST":
                self.close_connection = True      # its body, if any, is not read
            self._send(code, body)
            front.metrics.observe("other", code, time.perf_counter() - started)
            return
        if not front.slots.acquire(blocking=False):
            self.close_connection = True
            self._send(503, {"error": f"busy: {front.max_inflight} requests are being answered; retry"},
                       {"Retry-After": "1"})
            front.metrics.observe(path, 503, time.perf_counter() - started)
            return
        try:
            code, body = route(self)
        except BadRequest as exc:
            code, body = 400, {"error": str(exc)}
        except _Refused as exc:
            self.close_connection = True
            code, body = exc.code, {"error": str(exc)}
        except Exception as exc:       # noqa: BLE001 - a reply, not a dead handler thread
            code, body = 500, {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            front.slots.release()
        if isinstance(body, bytes):
            self._send_bytes(code, body, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(code, body)
        front.metrics.observe(path, code, time.perf_counter() - started)

    def _send(self, code: int, body: dict, headers: dict | None = None) -> None:
        started = time.perf_counter()
        data = json.dumps(body).encode()
        timing = getattr(self, "timing", None)
        if timing is not None:
            self.timing = None
            stages = timing + [("reply", time.perf_counter() - started)]
            headers = (headers or {}) | {"Server-Timing": ", ".join(f"{k};dur={v * 1e3:.3f}" for k, v in stages)}
        self._send_bytes(code, data, "application/json", headers)

    def _send_bytes(self, code: int, data: bytes, kind: str, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def json_body(self):
        """The request's JSON, read only once its declared size is known and allowed."""
        limit = self.server.front.max_body
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise _Refused(411, "send the body with a Content-Length (no chunked transfer)")
        length = self.headers.get("Content-Length")
        if length is None:
            raise _Refused(411, "a POST needs a Content-Length")
        try:
            size = int(length)
        except ValueError:
            raise _Refused(400, f"Content-Length {length[:40]!r} is not a number") from None
        if size < 0 or size > limit:
            raise _Refused(413, f"body of {size} bytes: at most {limit} (--max-body); split the request")
        data = self.rfile.read(size)
        if len(data) != size:
            raise _Refused(400, f"body ended after {len(data)} of {size} bytes")
        return parse_json(data)


# Every digit byte as "0", every other byte as " ": a body with 20 digits in a row may hold an integer
# past 64 bits, which orjson reads as a float (json: an int). ~60 us for 54 kB, at C speed.
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG = b"0" * 20


def parse_json(data: bytes):
    """``json.loads(data)``, by orjson where it takes the body (the same objects: RFC 8259 JSON);
    what orjson refuses and json reads (NaN, Infinity, 1e400, lone surrogates, UTF-16, a BOM,
    nesting past 1024) and a body with a run of 20 digits (an integer orjson would read as a float
    past 64 bits) are read by json as before, and an error is json's."""
    if orjson is not None and _LONG not in data.translate(_DIGITS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the body is not JSON ({str(exc)[:200]})") from None


class _Refused(Exception):
    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


def _scores(scores) -> list:
    return scores.tolist()


class ServingFront:
    def __init__(self, replica, host: str = "127.0.0.1", port: int = 0, max_body: int = MAX_BODY,
                 max_inflight: int = MAX_INFLIGHT, timeout: float = TIMEOUT):
        if replica.encoder is None:
            raise ConfigError(f"{replica.root / 'model.pt'}: the model records no schema, so JSON rows cannot be "
                              f"encoded for it: serve a model built by paramshard.models.build_model")
        self.replica, self.max_body, self.max_inflight, self.timeout = replica, max_body, max_inflight, timeout
        self.metrics = ServeMetrics(replica)
        self.slots = threading.BoundedSemaphore(max_inflight)
        self.routes = {("POST", "/predict"): self._predict, ("POST", "/predict/batch"): self._batch,
                       ("GET", "/health"): self._health, ("GET", "/metrics"): self._metrics}
        try:
            self._httpd = _Server((host, port), _Handler)
        except (OSError, OverflowError) as exc:
            raise ConfigError(f"paramshard serve: cannot listen on {host}:{port}: {exc} (port taken? another "
                              f"--port, or 0 for any free one)") from None
        self._httpd.front = self
        self.host, self.port = host, self._httpd.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "ServingFront":
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="serve-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.2)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- endpoints -----------------------------------------------------------------------------
    def _predict(self, request):
        started = time.perf_counter()
        body = request.json_body()
        rows = body.get("rows") if isinstance(body, dict) else body
        if isinstance(body, dict) and "rows" not in body:
            raise BadRequest('expected {"rows": [{column: value, ...}, ...]} or the list of rows alone')
        parsed = time.perf_counter()
        batch = self.replica.encoder.batch_of_rows(rows)
        encoded = time.perf_counter()
        scores, version = self.replica.score_batch(batch)
        request.timing = [("read", parsed - started), ("encode", encoded - parsed),
                          ("forward", time.perf_counter() - encoded)]
        self.metrics.scored.inc(len(scores))
        return 200, {"scores": _scores(scores), "version": version}

    def _batch(self, request):
        body = request.json_body()
        if isinstance(body, dict) and "columns" in body:
            scores, version = self.replica.score_batch(self.replica.encoder.batch_of_columns(body["columns"]))
            self.metrics.scored.inc(len(scores))
            return 200, {"scores": _scores(scores), "version": version}
        if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
            raise BadRequest('expected {"columns": {column: [values]}} or {"requests": [{"rows": [...]}, ...]}')
        requests = body["requests"]
        counts = []
        for i, r in enumerate(requests):
            if not isinstance(r, dict) or not isinstance(r.get("rows"), list):
                raise BadRequest(f'request {i}: expected {{"rows": [...]}}')
            counts.append(len(r["rows"]))
        if sum(counts) > MAX_ROWS:
            check_count(sum(counts))
        if not all(counts):
            raise BadRequest(f"request {counts.index(0)}: no rows to score")
        rows = [row for r in requests for row in r["rows"]]
        scores, version = self.replica.score_batch(self.replica.encoder.batch_of_rows(rows))
        self.metrics.scored.inc(len(scores))
        out, start = [], 0
        for n in counts:
            out.append({"scores": _scores(scores[start:start + n])})
            start += n
        return 200, {"results": out, "version": version}

    def _health(self, request):
        health = self.replica.health()
        return (200 if health["ok"] else 503), health

    def _metrics(self, request):
        return 200, self.metrics.text()
