"""Prometheus ``/metrics`` for servers and trainers (PARAMSHARD_METRICS_PORT).

Server i listens on PORT+i, trainer j on PORT+servers+j. Each endpoint has its
own ``CollectorRegistry`` (never prometheus_client's global one), so several
servers or trainers in one process (tests, the in-process standalone run) do
not collide, and ``close()`` stops its HTTP thread and frees its port.

A server's loop is single-threaded and owns its counters: the collector here
runs in the HTTP thread, so it reads only ``ParameterServer.cached_stats()``,
the snapshot the loop stores about once a second (``stats_age_seconds`` says
how old it is: a loop stuck in a handler shows as a growing age). The names
follow observe/run_records/records.py's server and trainer records.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from paramshard.errors import ConfigError
from paramshard.messages.server_stats import ServerStats
from paramshard.observe.run_records.batch_size import watch_batch_size

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from torch.utils.hooks import RemovableHandle

SERVER = "paramshard_server_"
TRAINER = "paramshard_trainer_"
WIRE_PHASES = ("decode", "reply")       # phase_seconds keys that are not an op's handler
PHASES = ("pull", "compute", "push")
# Step phases run from ~100 us (a local push) to seconds (a sync barrier behind a slow trainer).
PHASE_BUCKETS = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
RATE_WINDOW = 1.0     # seconds over which samples_per_second is measured (as the trainer records)
LOOPBACK = ("127.", "localhost", "[::1]", "::1", "in-process")


class MetricsEndpoint:
    """``http://host:port/metrics`` serving one registry from a daemon thread."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str, who: str):
        host = host.strip("[]")     # an IPv6 address as written in host:port
        host = "0.0.0.0" if host in ("*", "") else host
        try:
            httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except (OSError, OverflowError) as exc:
            raise ConfigError(f"{who}: cannot serve /metrics on {host}:{port}: {exc} "
                              f"(PARAMSHARD_METRICS_PORT: port taken, or base + index past 65535?)") from None
        self.registry, self.host = registry, host
        self.port = httpd.server_port      # the one picked, for port 0
        self._httpd: WSGIServer | None = httpd        # None once closed
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        with self._lock:       # idempotent: a process's exit path and a test may both close it
            httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()       # stops serve_forever (it polls every 0.5 s)
        httpd.server_close()   # frees the port
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- servers ------------------------------------------------------------------
class ServerCollector(Collector):
    """A server's counters, read from the snapshot its loop cached (never live state)."""

    def __init__(self, server):
        self.server = server
        self.label = str(server.server_id)

    def collect(self):
        wire, age = self.server.cached_stats()
        yield self._family(GaugeMetricFamily, "stats_age_seconds", "seconds since the server loop took "
                           "the snapshot these figures come from", [([], age)])
        if wire is None:
            return
        stats = ServerStats.from_wire(wire)
        for name, key, doc in (("requests_total", "requests", "requests received"),
                               ("errors_total", "errors", "requests answered with an error"),
                               ("timeouts_total", "timeouts", "waiting requests that reached the deadline"),
                               ("bytes_in_total", "bytes_in", "request bytes received"),
                               ("bytes_out_total", "bytes_out", "array bytes sent in replies")):
            yield self._family(CounterMetricFamily, name, doc, [([], stats.counter(key))])
        # Gauges of the parts this server has (a server without sparse tables has no sparse gauges).
        for name, part, doc in (("dense_elements", stats.dense, "dense parameter elements held"),
                                ("dense_blocks", stats.dense, "dense blocks held"),
                                ("sparse_rows", stats.sparse, "sparse rows held, all tables"),
                                ("sparse_bytes", stats.sparse, "bytes of sparse rows held, all tables")):
            if part is not None:
                yield self._family(GaugeMetricFamily, name, doc, [([], getattr(stats, name))])
        yield self._family(CounterMetricFamily, "requests_by_op_total", "requests received, by op",
                           [([op], n) for op, n in stats.ops.items()], ["op"])
        phases = stats.phase_seconds
        yield self._family(CounterMetricFamily, "handler_seconds_total", "seconds in each op's handler",
                           [([op], s) for op, s in phases.items() if op not in WIRE_PHASES], ["op"])
        yield self._family(CounterMetricFamily, "wire_seconds_total", "seconds decoding requests and "
                           "sending replies", [([p], phases[p]) for p in WIRE_PHASES if p in phases], ["phase"])
        tables = stats.tables
        for name, key, doc in (("table_rows", "rows", "rows held, by table"),
                               ("table_bytes", "bytes", "bytes of rows held, by table"),
                               ("table_version", "version", "updates applied to the table")):
            yield self._family(GaugeMetricFamily, name, doc,
                               [([table], getattr(t, key)) for table, t in tables.items()], ["table"])
        # The disk tier of tables with a memory budget (server/storage/tiered_row_store.py).
        tiered = {table: t.tier for table, t in tables.items() if t.tier is not None}
        if tiered:
            for name, key, doc, cls in (
                    ("table_memory_budget_bytes", "budget", "the table's memory budget (0: only the server's)",
                     GaugeMetricFamily),
                    ("table_resident_bytes", "resident_bytes", "bytes of the table estimated in RAM (ids, index, "
                     "regions not spilled)", GaugeMetricFamily),
                    ("table_tier_hit_rate", "hit_rate", "share of row accesses whose rows were in RAM",
                     GaugeMetricFamily),
                    ("table_tier_hits_total", "hits", "row accesses whose rows were in RAM", CounterMetricFamily),
                    ("table_tier_misses_total", "misses", "row accesses whose rows had been spilled",
                     CounterMetricFamily),
                    ("table_tier_spills_total", "spills", "regions of rows dropped from RAM to the file tier",
                     CounterMetricFamily),
                    ("table_tier_promotions_total", "promotions", "spilled regions brought back by an access",
                     CounterMetricFamily)):
                yield self._family(cls, name, doc, [([table], getattr(t, key)) for table, t in tiered.items()],
                                   ["table"])
        if stats.sparse is not None and stats.sparse.memory_budget is not None:
            yield self._family(GaugeMetricFamily, "memory_budget_bytes", "the server's memory budget "
                               "(PARAMSHARD_MEMORY_BUDGET)", [([], stats.sparse.memory_budget)])
            yield self._family(GaugeMetricFamily, "rss_bytes", "the process's resident bytes when the budget was "
                               "last checked", [([], stats.sparse.rss_bytes or 0)])
        yield self._family(GaugeMetricFamily, "trainers", "trainers by state: live, left (done), lost",
                           [([state], len(getattr(stats.trainers, state))) for state in ("live", "left", "lost")],
                           ["state"])
        # Async push staleness histogram ({0: n, 1: n, ...}), once the server counts it.
        staleness = stats.staleness
        if staleness:
            yield self._family(CounterMetricFamily, "push_staleness_total", "async pushes by staleness "
                               "(updates applied between the trainer's read and its push)",
                               [([str(k)], n) for k, n in staleness.items()], ["staleness"])

    def _family(self, cls, name: str, doc: str, samples, labels=()):
        family = cls(SERVER + name, doc, labels=["server", *labels])
        for values, value in samples:
            family.add_metric([self.label, *values], value)
        return family


def serve_server_metrics(server, port: int, host: str = "127.0.0.1") -> MetricsEndpoint:
    """Serve ``server``'s counters at ``http://host:port/metrics`` until ``close()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(server))
    return MetricsEndpoint(registry, port, host, server.name)


def server_metrics(env, server) -> MetricsEndpoint | None:
    """Server ``env.server_id``'s endpoint when PARAMSHARD_METRICS_PORT is set, on the host
    the server itself is bound to (loopback for a local job)."""
    if not env.metrics_port:
        return None
    return serve_server_metrics(server, env.metrics_port + env.server_id, server.address.rpartition(":")[0])


# -- trainers -----------------------------------------------------------------
class TrainerMetrics:
    """A trainer's exporter: steps, samples, loss, throughput, step phases, user metrics."""

    def __init__(self, trainer_id: int, port: int, host: str = "127.0.0.1"):
        self.registry = CollectorRegistry(auto_describe=False)
        r, label = self.registry, {"trainer": str(trainer_id)}
        self._steps = Counter(TRAINER + "steps", "steps pushed", ["trainer"], registry=r).labels(**label)
        self._samples = Counter(TRAINER + "samples", "samples trained (the first dimension of the first "
                                "tensor each forward got)", ["trainer"], registry=r).labels(**label)
        self._loss = Gauge(TRAINER + "loss", "loss of the last step", ["trainer"], registry=r).labels(**label)
        self._rate = Gauge(TRAINER + "samples_per_second", f"samples per second over the last "
                           f"~{RATE_WINDOW:g} s", ["trainer"], registry=r).labels(**label)
        phase = Histogram(TRAINER + "step_phase_seconds", "seconds of a step by phase: pull (waiting for "
                          "rows), push (waiting for push replies), compute (the rest)", ["trainer", "phase"],
                          buckets=PHASE_BUCKETS, registry=r)
        self._phase = {p: phase.labels(trainer=label["trainer"], phase=p) for p in PHASES}
        self._user = Gauge(TRAINER + "metric", "the script's own metrics (set_metric)", ["trainer", "name"],
                           registry=r)
        self.trainer_id = trainer_id
        self._lock = threading.Lock()     # the rate window and the pipeline marks below
        self._window_start, self._window_samples = time.monotonic(), 0
        self._last_end, self._last_pull, self._last_push = time.perf_counter(), 0.0, 0.0
        self._batch: int | None = None     # samples of the last forward (watch)
        self._hook: RemovableHandle | None = None     # on the model watched (watch)
        self.endpoint = MetricsEndpoint(r, port, host, f"trainer {trainer_id}")

    @property
    def port(self) -> int:
        return self.endpoint.port

    def observe_step(self, samples: int | None, loss=None, phases: dict | None = None) -> None:
        """One step done: ``samples`` in it (None: unknown), its ``loss`` (a number or a scalar
        tensor), ``phases``: seconds by phase, any of pull, compute, push."""
        self._steps.inc()
        if loss is not None:     # a tensor is detached first: float() of one with grad warns
            self._loss.set(float(loss.detach() if hasattr(loss, "detach") else loss))
        for name, seconds in (phases or {}).items():
            self._phase[name].observe(max(0.0, seconds))
        if samples:
            self._samples.inc(samples)
        with self._lock:
            self._window_samples += samples or 0
            now = time.monotonic()
            if now - self._window_start >= RATE_WINDOW:
                self._rate.set(self._window_samples / (now - self._window_start))
                self._window_start, self._window_samples = now, 0

    def watch(self, model) -> None:
        """Count samples per step as the first dimension of the first tensor each forward
        of ``model`` gets (Trainer.step is not told the batch size)."""
        def note(samples: int) -> None:
            self._batch = samples
        self._hook = watch_batch_size(model, note)

    def observe_pipeline(self, pipeline, loss=None) -> None:
        """``observe_step`` for a Trainer's step: the samples of the last forward (``watch``),
        and phases from the trainer's own counters (client/step.py PipelineStats,
        cumulative): pull and push are the waits since the previous step, compute is the
        rest of the time since then (forward, backward, data loading, encoding)."""
        samples, self._batch = self._batch, None
        with self._lock:
            now = time.perf_counter()
            pull = pipeline["pull_wait_s"] - self._last_pull
            push = pipeline["push_wait_s"] - self._last_push
            phases = {"pull": pull, "push": push, "compute": now - self._last_end - pull - push}
            self._last_end, self._last_pull, self._last_push = now, pipeline["pull_wait_s"], pipeline["push_wait_s"]
        self.observe_step(samples, loss, phases)

    def set_metric(self, name: str, value: float) -> None:
        self._user.labels(trainer=str(self.trainer_id), name=name).set(value)

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.endpoint.close()


def trainer_bind_address(env) -> str:
    """Where a trainer's /metrics listens: its host's own address when the launcher or engine
    told it (PARAMSHARD_HOST: `launch --hosts`, `paramshard run`), where Prometheus on
    another host reaches it and nothing else does; else loopback when every server is (a
    local job); else every interface (a pod, whose network is its own)."""
    if env.host:
        return env.host
    if all(address.startswith(LOOPBACK) for address in env.servers):
        return "127.0.0.1"
    return "0.0.0.0"


def trainer_metrics(env, model=None) -> TrainerMetrics | None:
    """Trainer ``env.trainer_id``'s exporter when PARAMSHARD_METRICS_PORT is set, counting
    ``model``'s batches, on ``trainer_bind_address(env)``."""
    if not env.metrics_port:
        return None
    metrics = TrainerMetrics(env.trainer_id, env.metrics_port + len(env.servers) + env.trainer_id,
                             trainer_bind_address(env))
    if model is not None:
        metrics.watch(model)
    return metrics
