"""/metrics of a serving replica (Prometheus text, its own registry as observe/live/prometheus.py's).

Requests and their latency are counted by the HTTP front as they are answered; the replica's
figures (files and rows applied, rows held, freshness, the version, apply time and the longest
lookup stall) are read when scraped.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "paramshard_serve_"
# A request of 100 rows is answered in ~1 ms; a big batch or a cold tier in tens.
LATENCY_BUCKETS = (2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class ReplicaCollector(Collector):
    def __init__(self, replica):
        self.replica = replica

    def collect(self):
        r = self.replica
        version = r.version

        def gauge(name, doc, samples, labels=()):
            family = GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))
            for values, value in samples:
                family.add_metric(list(values), value)
            return family

        applied = CounterMetricFamily(PREFIX + "applied_files", "delta and snapshot files applied")
        applied.add_metric([], r.files_applied)
        yield applied
        rows = CounterMetricFamily(PREFIX + "applied_rows", "rows set by the files applied")
        rows.add_metric([], r.rows_applied)
        yield rows
        yield gauge("rows", "rows held by the served version, by table",
                    [((name,), t.num_rows) for name, t in r.live_tables().items()], ["table"])
        freshness = r.freshness()
        if freshness is not None:
            yield gauge("freshness_seconds", "seconds since the newest applied file was created", [((), freshness)])
        yield gauge("version_step", "the least step among the servers' applied files", [((), version["step"])])
        yield gauge("version_seq", "seq of the last file applied, by server",
                    [((s,), seq) for s, seq in version["servers"].items()], ["server"])
        if r.encoder is not None:
            encoded = CounterMetricFamily(PREFIX + "encoded_requests", "requests whose rows were encoded, by path "
                                          "(fast: serving/fast_rows.py; encoder: the schema Encoder, for what the "
                                          "fast path does not take)", labels=["path"])
            encoded.add_metric(["fast"], r.encoder.fast.fast)
            encoded.add_metric(["encoder"], r.encoder.fast.fallbacks)
            yield encoded
        yield gauge("apply_seconds", "seconds the last change took, both copies", [((), r.buffer.last_apply_s)])
        yield gauge("apply_seconds_max", "the longest change, both copies", [((), r.buffer.max_apply_s)])
        yield gauge("lookup_stall_seconds_max", "the longest a lookup waited to start (the version switch)",
                    [((), r.buffer.max_stall_s)])
        yield gauge("errors", "what stops following now (a gap, a damaged file): 0 when healthy",
                    [((), len(r.errors) + bool(r.buffer.broken))])


class ServeMetrics:
    def __init__(self, replica):
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(PREFIX + "requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "code"], registry=self.registry)
        self.latency = Histogram(PREFIX + "request_seconds", "seconds to answer a request, by endpoint",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.scored = Counter(PREFIX + "scored_rows", "rows scored", registry=self.registry)
        self.registry.register(ReplicaCollector(replica))

    def observe(self, endpoint: str, code: int, seconds: float) -> None:
        self.requests.labels(endpoint=endpoint, code=str(code)).inc()
        self.latency.labels(endpoint=endpoint).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)
