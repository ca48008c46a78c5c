"""serving/http.py: /predict answers what `paramshard predict` gives with a model file of the same
rows and parameters (the model file oracle: load_model + forward); /predict/batch the same in its
two forms; /health and /metrics parse; hostile requests are refused before anything is allocated."""
import http.client
import json

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from paramshard.inference.scoring import predict_files
from paramshard.inference.serving import model_dict, read_model, sparse_entry, write_model_file
from paramshard.online.delta_format import TableChange
from paramshard.serving.http import ServingFront
from paramshard.serving.live_table import StoreChoice
from paramshard.serving.replica import Replica
from paramshard.serving.rows import BadRequest
from paramshard.tables import Admission
from tests.unit.serving.delta_dir import delta, make_model_dir, publish

ROWS = [{"price": "3.5", "city": "paris", "tags": "a|b"}, {"price": "", "city": "rome", "tags": "c"},
        {"price": "120", "city": "oslo", "tags": "a|d|b"}, {"price": "0.2", "city": "kyiv", "tags": ""}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A replica on a directory of a snapshot and a delta (rows of the ids the rows above use, and a
    dense block), its HTTP front, and the oracle: a model file with the same rows and parameters."""
    root = tmp_path_factory.mktemp("serve")
    module = make_model_dir(root)
    g = np.random.default_rng(1)
    from paramshard.serving.rows import RowEncoder
    batch = RowEncoder(module, root / "model.pt").encode(RowEncoder(module, root / "model.pt").from_rows(ROWS))
    ids = np.unique(batch.ids.astype(np.uint64))
    tables = {name: TableChange(ids, g.standard_normal((len(ids), dim)).astype(np.float32), np.zeros(0, np.uint64))
              for name, dim in (("wide", 1), ("deep", 4))}
    publish(root, "snapshot", 0, 0, 0, {"deep": tables["deep"]})
    block = g.standard_normal(8).astype(np.float32)
    publish(root, "delta", 0, 1, 3, {"wide": tables["wide"]}, {"mlp.0.bias.block0": block})
    replica = Replica(root, StoreChoice("numpy")).start()
    front = ServingFront(replica, max_body=1 << 16, max_inflight=4).start()
    # The oracle file: model.pt's parameters with the block written, the tables' rows.
    base = read_model(root / "model.pt")
    dense = {n: t.numpy().copy() for n, t in base.dense.items()}
    dense["mlp.0.bias"][:] = block
    sparse = {name: sparse_entry(c.ids, c.values, c.dim, base.tables[name].seed, base.tables[name].init_scale,
                                 "float32", Admission()) for name, c in tables.items()}
    write_model_file(model_dict(3, None, dense, sparse, base.spec), root / "oracle.pt")
    pd.DataFrame(ROWS).to_csv(root / "rows.csv", index=False)
    predict_files(root / "oracle.pt", [root / "rows.csv"], root / "scores.csv")
    yield front, pd.read_csv(root / "scores.csv")["score"].to_numpy(), root
    front.close()
    replica.close()


def call(front, method, path, body=None, headers=None):
    connection = http.client.HTTPConnection(front.host, front.port, timeout=10)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        connection.request(method, path, data, headers or {})
        reply = connection.getresponse()
        text = reply.read()
        return reply.status, (json.loads(text) if reply.getheader("Content-Type") == "application/json" else text)
    finally:
        connection.close()


def test_predict_equals_the_model_file_oracle(served):
    front, expected, _ = served
    status, reply = call(front, "POST", "/predict", {"rows": ROWS})
    assert status == 200, reply
    np.testing.assert_array_equal(reply["scores"], expected)
    assert reply["version"] == {"servers": {"0": 1}, "step": 3, "number": 1}
    status, bare = call(front, "POST", "/predict", ROWS)          # the list alone
    assert bare["scores"] == reply["scores"]


def test_batch_forms_answer_the_same_scores(served):
    front, expected, _ = served
    columns = {name: [row[name] for row in ROWS] for name in ROWS[0]}
    status, reply = call(front, "POST", "/predict/batch", {"columns": columns})
    assert status == 200 and reply["version"]["servers"] == {"0": 1}
    np.testing.assert_array_equal(reply["scores"], expected)
    status, reply = call(front, "POST", "/predict/batch", {"requests": [{"rows": ROWS[:1]}, {"rows": ROWS[1:]}]})
    assert status == 200
    np.testing.assert_array_equal(reply["results"][0]["scores"] + reply["results"][1]["scores"], expected)


def test_json_numbers_read_as_a_files_numbers(served):
    front, expected, _ = served
    rows = [dict(r, price=float(r["price"]) if r["price"] else None) for r in ROWS]
    rows[0]["tags"] = ["a", "b"]
    status, reply = call(front, "POST", "/predict", {"rows": rows})
    np.testing.assert_array_equal(reply["scores"], expected)


def test_health_and_metrics_parse(served):
    front, _, _ = served
    call(front, "POST", "/predict", {"rows": ROWS})
    status, health = call(front, "GET", "/health")
    assert status == 200 and health["ok"] and health["version"]["servers"] == {"0": 1}
    held = len(front.replica.buffer.copies[0].tables["deep"].store.ids())
    assert health["freshness_s"] >= 0 and health["rows"] == {"wide": held, "deep": held} and held > 0
    status, text = call(front, "GET", "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert families["paramshard_serve_applied_files"].samples[0].value == 2
    requests = {s.labels["endpoint"]: s.value for s in families["paramshard_serve_requests"].samples
                if s.name.endswith("_total") and s.labels["code"] == "200"}
    assert requests["/predict"] >= 1
    assert "paramshard_serve_request_seconds" in families and "paramshard_serve_freshness_seconds" in families
    rows = {s.labels["table"]: s.value for s in families["paramshard_serve_rows"].samples}
    assert rows == {name: float(n) for name, n in health["rows"].items()}


def test_hostile_and_bad_requests_are_refused_with_a_reason(served):
    front, _, _ = served
    status, reply = call(front, "POST", "/predict", b"x" * 10, {"Content-Length": str(1 << 30)})
    assert status == 413 and "at most 65536" in reply["error"]
    status, reply = call(front, "POST", "/predict", b"[1,", {})
    assert status == 400 and "not JSON" in reply["error"]
    status, reply = call(front, "POST", "/predict", {"rows": [{"price": "lots", "city": "x", "tags": "a"}]})
    assert status == 400 and "row 0: column 'price' is not a number" in reply["error"]
    status, reply = call(front, "POST", "/predict", {"rows": [{"price": True}]})
    assert status == 400 and "column 'price': bool is not a value" in reply["error"]
    status, reply = call(front, "POST", "/predict", {"rows": [{}] * 10_001})
    assert status in (400, 413)
    status, reply = call(front, "POST", "/predict", {"rows": []})
    assert status == 400 and "no rows" in reply["error"]
    status, reply = call(front, "GET", "/nope")
    assert status == 404 and "POST /predict" in reply["error"]
    status, reply = call(front, "GET", "/predict")
    assert status == 405
    status, reply = call(front, "POST", "/predict", b"[" * 100_000 + b"]" * 100_000, {})
    assert status == 413


def test_connections_past_the_cap_are_closed_and_the_others_served(served):
    import socket
    front, expected, _ = served
    held = [socket.create_connection((front.host, front.port), timeout=10) for _ in range(3)]
    try:
        # The cap is taken by the idle connections above (and any left from other tests): lower it to them.
        semaphore = front._httpd.connections
        while semaphore.acquire(blocking=False):
            held.append(None)           # a place taken without a connection: the cap is now full
        extra = socket.create_connection((front.host, front.port), timeout=10)
        assert extra.recv(100) == b""   # closed by the server (sent nothing: a close with unread bytes would reset)
        extra.close()
    finally:
        for _ in [h for h in held if h is None]:
            semaphore.release()
        for h in held:
            if h is not None:
                h.close()
    status, reply = call(front, "POST", "/predict", {"rows": ROWS})
    assert status == 200 and reply["scores"] == expected.tolist()


def test_a_scoring_reply_says_where_its_time_went_and_which_path_encoded_it(served):
    front, _, _ = served
    before = front.replica.health()["encoded"]
    connection = http.client.HTTPConnection(front.host, front.port, timeout=10)
    try:
        connection.request("POST", "/predict", json.dumps({"rows": ROWS}).encode())
        reply = connection.getresponse()
        reply.read()
        timing = reply.getheader("Server-Timing")
    finally:
        connection.close()
    stages = dict(part.strip().split(";dur=") for part in timing.split(","))
    assert list(stages) == ["read", "encode", "forward", "reply"] and all(float(v) >= 0 for v in stages.values())
    after = front.replica.health()["encoded"]
    assert after == {"fast": before["fast"] + 1, "encoder": before["encoder"]}      # plain rows: the fast path
    status, text = call(front, "GET", "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    paths = {s.labels["path"]: s.value for s in families["paramshard_serve_encoded_requests"].samples
             if s.name.endswith("_total")}
    assert paths == {"fast": after["fast"], "encoder": after["encoder"]}


def test_requests_on_one_kept_connection_are_each_answered_whole(served):
    """The reply is written through a buffer (one send): each of several requests on one connection
    gets its whole reply, and an error reply that closes the connection is sent too."""
    front, expected, _ = served
    connection = http.client.HTTPConnection(front.host, front.port, timeout=10)
    try:
        for _ in range(3):
            connection.request("POST", "/predict", json.dumps({"rows": ROWS}).encode())
            reply = connection.getresponse()
            assert reply.status == 200 and json.loads(reply.read())["scores"] == expected.tolist()
        connection.request("GET", "/nope")
        reply = connection.getresponse()
        assert reply.status == 404 and "POST /predict" in json.loads(reply.read())["error"]
    finally:
        connection.close()


@pytest.mark.parametrize("text", [
    b'{"rows": [{"a": "x", "b": 1.5, "c": -0.0, "d": null, "e": [1, "2"]}]}', b'[1, 2.5e300, -0, "\\u00e9"]',
    b'{"a": 1, "a": 2}', b'[NaN, Infinity, -Infinity]', b'[123456789012345678901234567890]',
    b'["\\ud800"]', '{"a": "\u00e9"}'.encode("utf-16"), b"[" * 2000 + b"]" * 2000, b" \n[1e400]\n",
    b'[18446744073709551615, 18446744073709551616, -9223372036854775809, "12345678901234567890123"]',
    b'["a\x01b"]', b"\xef\xbb\xbf[1]", b'["\xed\xa0\x80"]', b'[0.1000000000000000055511151231257827, 1.7976931348623157e308]',
    json.dumps([float(x) for x in np.random.default_rng(0).standard_normal(300) * 10.0 ** np.arange(-150, 150)]).encode()])
def test_bodies_parse_as_json_parses_them(text):
    """orjson reads what it takes; what it refuses (NaN, big integers, lone surrogates, UTF-16, deep
    nesting) json reads: every body gives json.loads's objects, and a body that is not JSON is refused."""
    from paramshard.serving.http import parse_json
    try:
        expected = json.loads(text)
    except (ValueError, RecursionError):
        with pytest.raises(BadRequest, match="not JSON"):
            parse_json(text)
        return
    got = parse_json(text)
    assert json.dumps(got) == json.dumps(expected)       # the same values (NaN compares unequal; its text does not)
    assert repr(got) == repr(expected)                   # and types (1 vs 1.0, -0.0)


@pytest.mark.parametrize("text", [b"[1,", b"", b"{'a': 1}", b"[1] x", b"\xff"])
def test_a_body_that_is_not_json_is_refused(text):
    from paramshard.serving.http import parse_json
    with pytest.raises(BadRequest, match="the body is not JSON"):
        parse_json(text)


def test_a_client_expecting_100_continue_gets_it_before_its_body(served):
    """Replies leave through a buffer at the request's end: the interim "100 Continue" is sent at
    once all the same (curl waits for it, a second by default, before sending a large body)."""
    import socket
    front, expected, _ = served
    body = json.dumps({"rows": ROWS}).encode()
    with socket.create_connection((front.host, front.port), timeout=10) as s:
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.settimeout(5)             # a deadline: without the flush it would come only after the body
        assert s.recv(100).startswith(b"HTTP/1.1 100")
        s.sendall(body)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < int(
                reply.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0]):
            reply += s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["scores"] == expected.tolist()
