"""Prometheus /metrics of servers and trainers (observe/live/prometheus.py, PARAMSHARD_METRICS_PORT).

Oracles: a server's gauges equal what the `stats` op reports once training
stopped, its request counter grows while training goes on, a trainer's step
counter equals the steps it took; endpoints in one process never share a
registry, and close() gives the port back."""
import http.client
import socket
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
from prometheus_client.parser import text_string_to_metric_families

import paramshard as ps
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.launch.engines.ports import free_ports
from paramshard.observe.live.prometheus import TrainerMetrics, serve_server_metrics
from paramshard.server.core.parameter_server import ParameterServer
from paramshard.trainer.trainer import Trainer

BATCH = 4


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = ps.SparseEmbedding("t", 4, optimizer=ps.optim.SGD(lr=0.01), init_scale=0.1)
        self.head = nn.Linear(4 + 3, 1)

    def forward(self, x, ids):
        return self.head(torch.cat([self.emb(ids), x], 1)).pow(2).mean()


def batch(rng):
    return (torch.from_numpy(rng.standard_normal((BATCH, 3)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, 100, (BATCH, 2))))    # bags of 2 ids


def consecutive_free_ports(count: int) -> int:
    """A base port whose next ``count`` ports are all free right now."""
    for _ in range(50):
        base = free_ports(1)[0]
        if base + count > 65535:
            continue
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports found")


def scrape(port: int) -> dict:
    """{(sample name, sorted labels): value} of http://127.0.0.1:port/metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(metrics: dict, name: str, /, **labels):
    return metrics.get((name, tuple(sorted(labels.items()))))


def wait_for(get, what: str, ok=bool, timeout: float = 10.0):
    """The first ``get()`` that is ``ok``, polling until the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = get()
        if ok(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def refused(port: int) -> bool:
    try:
        scrape(port)
    except urllib.error.URLError:
        return True
    except (ConnectionError, http.client.HTTPException):
        # Accepted, then reset or cut mid-reply while the process exits (its handler threads are
        # daemons: seen in CI as IncompleteRead): not gone yet, ask again.
        return False
    return False


def test_server_and_trainer_endpoints_while_training(cluster):
    base = consecutive_free_ports(2)              # server 0 on base, trainer 0 on base + 1
    c = cluster(servers=1, trainers=1, metrics_port=base, in_process=False)   # the endpoint is the process main's
    model, rng = Model(), np.random.default_rng(0)
    trainer = Trainer(model, ps.optim.SGD(lr=0.01), env=c.trainer_env(0))
    steps, loss = 0, None
    requests = lambda m: value(m, "paramshard_server_requests_total", server="0") or 0   # noqa: E731

    def train_then_scrape(n=5):
        nonlocal steps, loss
        for _ in range(n):
            loss = model(*batch(rng))
            trainer.step(loss)
            steps += 1
        return scrape(base)

    try:
        # The server's loop refreshes the snapshot about once a second: scrape until it shows the work.
        first = wait_for(train_then_scrape, "first requests", ok=lambda m: requests(m) > 0)
        second = wait_for(train_then_scrape, "requests growing between scrapes",
                          ok=lambda m: requests(m) > requests(first))
        assert value(second, "paramshard_server_requests_by_op_total", server="0", op="push_dense") > 0
        assert value(second, "paramshard_server_handler_seconds_total", server="0", op="push_dense") > 0
        assert value(second, "paramshard_server_trainers", server="0", state="live") == 1
        assert value(second, "paramshard_server_stats_age_seconds", server="0") < 5
        assert not any(name == "paramshard_server_push_staleness_total" for name, _ in second)  # no such stats yet

        # Training stopped: the gauges settle on what the stats op reports.
        stats = trainer.server_stats()[0]
        expected = {("paramshard_server_dense_elements", ()): stats["dense_elements"],
                    ("paramshard_server_dense_blocks", ()): stats["dense_blocks"],
                    ("paramshard_server_sparse_rows", ()): stats["sparse_rows"],
                    ("paramshard_server_table_rows", (("table", "t"),)): stats["tables"]["t"]["rows"],
                    ("paramshard_server_table_bytes", (("table", "t"),)): stats["tables"]["t"]["bytes"],
                    ("paramshard_server_table_version", (("table", "t"),)): stats["tables"]["t"]["version"]}
        assert stats["dense_elements"] == 8 and stats["sparse_rows"] > 0

        def settled():
            m = scrape(base)
            seen = {key: value(m, key[0], server="0", **dict(key[1])) for key in expected}
            return seen == expected

        wait_for(settled, "server gauges equal to the stats op's")

        trainer.metrics.set_metric("auc", 0.75)
        t = scrape(base + 1)
        assert value(t, "paramshard_trainer_steps_total", trainer="0") == steps
        assert value(t, "paramshard_trainer_samples_total", trainer="0") == steps * BATCH
        assert value(t, "paramshard_trainer_loss", trainer="0") == pytest.approx(loss.item())
        assert value(t, "paramshard_trainer_samples_per_second", trainer="0") > 0   # trained > 1 s
        for phase in ("pull", "compute", "push"):
            assert value(t, "paramshard_trainer_step_phase_seconds_count", trainer="0", phase=phase) == steps
        assert value(t, "paramshard_trainer_metric", trainer="0", name="auc") == 0.75
    finally:
        trainer.close()
    assert refused(base + 1)           # close() took the trainer's endpoint down
    # The trainer left: the server process ends, and its endpoint with it.
    wait_for(lambda: refused(base), "server endpoint gone after the job ended")


def test_two_servers_in_one_process_do_not_collide():
    servers = [ParameterServer(i, "127.0.0.1:0", num_trainers=1, exit_when_trainers_leave=False).start()
               for i in range(2)]
    endpoints = []
    try:
        for s in servers:
            s.wait_ready()
        # Only server 1 reports async staleness (a key the stats may or may not have).
        plain = servers[1].snapshot_stats
        servers[1].snapshot_stats = lambda: {**plain(), "staleness": {"0": 5, "2": 1}}
        endpoints = [serve_server_metrics(s, 0) for s in servers]
        assert endpoints[0].port != endpoints[1].port
        scraped = [wait_for(lambda e=e: scrape(e.port), f"server {i}'s first snapshot",
                            ok=lambda m, i=i: value(m, "paramshard_server_requests_total", server=str(i)) == 0)
                   for i, e in enumerate(endpoints)]
        for i, m in enumerate(scraped):
            # Each endpoint serves its own server only.
            assert {dict(labels)["server"] for _, labels in m} == {str(i)}
            assert value(m, "paramshard_server_dense_elements", server=str(i)) == 0
        m = wait_for(lambda: scrape(endpoints[1].port), "staleness", ok=lambda m: value(
            m, "paramshard_server_push_staleness_total", server="1", staleness="0") == 5)
        assert value(m, "paramshard_server_push_staleness_total", server="1", staleness="2") == 1
        assert value(scrape(endpoints[0].port), "paramshard_server_push_staleness_total",
                     server="0", staleness="0") is None
    finally:
        for e in endpoints:
            e.close()
        for s in servers:
            s.close()


def test_close_frees_the_port():
    port = free_ports(1)[0]
    fake = SimpleNamespace(server_id=0, name="server 0", cached_stats=lambda: (None, 0.0))
    endpoint = serve_server_metrics(fake, port)
    assert value(scrape(port), "paramshard_server_stats_age_seconds", server="0") == 0.0
    with pytest.raises(ConfigError, match="cannot serve /metrics"):
        serve_server_metrics(fake, port)           # taken: said so, naming the port
    endpoint.close()
    endpoint.close()                               # twice: nothing left to do
    assert not endpoint._thread.is_alive() and refused(port)
    with socket.socket() as s:                     # nobody listens there any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    metrics = TrainerMetrics(3, port)              # and the next exporter takes it
    metrics.observe_step(8, loss=0.5, phases={"push": 0.01})
    assert value(scrape(port), "paramshard_trainer_samples_total", trainer="3") == 8
    metrics.close()
    assert refused(port)


def test_metrics_port_in_the_environment():
    env = ClusterEnv.from_environ({"PARAMSHARD_METRICS_PORT": "9100"})
    assert env.metrics_port == 9100 and ClusterEnv.from_environ({}).metrics_port == 0
    assert ClusterEnv.from_environ(env.to_environ()) == env
    with pytest.raises(ConfigError, match="PARAMSHARD_METRICS_PORT=70000"):
        ClusterEnv.from_environ({"PARAMSHARD_METRICS_PORT": "70000"})
