"""KafkaStream against a real Kafka-protocol broker (tests/engines/kafka.py, one per session):
every record to exactly one rank, an exact resume from a saved position, and commits that a new
consumer of the group starts after. Oracles: the produced ids, each seen exactly once."""
import json
import time

import pytest

from paramshard.data.stream.kafka import KafkaStream, KafkaStreamError
from paramshard.data.stream.kafka_config import KafkaConfigError
from paramshard.data.stream.source import StreamSource
from tests.engines.kafka import kafka_broker  # noqa: F401 - fixture

DEADLINE = 30.0   # seconds for records that are already in the topic to arrive
pytestmark = pytest.mark.processes   # starts and stops broker processes: `make test`, not `make check`


def read(stream, count, max_records=16):
    """Poll until ``count`` records came (or the deadline): the ids, in order, and the batches."""
    ids, batches, end = [], [], time.monotonic() + DEADLINE
    while len(ids) < count and time.monotonic() < end:
        batch = stream.poll(max_records, timeout=0.5)
        if batch is not None:
            assert len(batch.records) <= max_records
            ids += batch.records["id"].tolist()
            batches.append(batch)
    assert len(ids) >= count, f"only {len(ids)} of {count} records within {DEADLINE} s"
    return ids, batches


def assert_quiet(stream):
    """Nothing more: every record was already handed out."""
    assert stream.poll(100, timeout=0.5) is None


def json_values(n):
    return [json.dumps({"id": i, "label": i % 2, "c1": f"v{i % 7}"}).encode() for i in range(n)]


def test_two_ranks_read_every_record_exactly_once(kafka_broker):
    n, partitions = 200, 4
    topic = kafka_broker.create_topic(partitions)
    before = time.time()
    kafka_broker.produce(topic, json_values(n), partition_of=lambda i: i % partitions)
    streams = [KafkaStream(kafka_broker.bootstrap, topic, "every-once", rank=r, world=2) for r in range(2)]
    try:
        assert all(isinstance(s, StreamSource) for s in streams)
        got = {}
        for rank, stream in enumerate(streams):
            ids, batches = read(stream, n // 2)
            assert_quiet(stream)
            got[rank] = ids
            # partition p goes to rank p % 2; each partition in produce order
            assert {i % partitions % 2 for i in ids} == {rank}
            for p in (rank, rank + 2):
                assert [i for i in ids if i % partitions == p] == list(range(p, n, partitions))
            assert stream.position() == {str(rank): n // partitions, str(rank + 2): n // partitions}
            assert batches[-1].position == stream.position()
            assert all(before - 5 <= b.arrived <= time.time() for b in batches)
            assert set(batches[0].records.columns) == {"id", "label", "c1"}
        assert sorted(got[0] + got[1]) == list(range(n))
    finally:
        for s in streams:
            s.close()


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_new_consumer_seeking_a_saved_position_reads_the_rest_exactly_once(kafka_broker, fmt):
    n, partitions = 90, 3
    topic = kafka_broker.create_topic(partitions)
    if fmt == "csv":
        values = [f"{i},{i % 2},\"v,{i % 7}\"".encode() for i in range(n)]
        options = {"format": "csv", "columns": "id,label,c1"}
    else:
        values, options = json_values(n), {}
    kafka_broker.produce(topic, values, partition_of=lambda i: i % partitions)
    with KafkaStream(kafka_broker.bootstrap, topic, "first", **options) as first:
        before, batches = read(first, 40, max_records=7)
        saved = json.loads(json.dumps(batches[-1].position))   # as a checkpoint stores it
        assert saved == first.position()
        if fmt == "csv":
            assert batches[0].records["c1"].str.startswith("v,").all()
    # Another group (nothing committed there either): only the position decides where it goes on.
    with KafkaStream(kafka_broker.bootstrap, topic, "second", **options) as second:
        second.seek(saved)
        rest, _ = read(second, n - len(before))
        assert_quiet(second)
    assert sorted(before + rest) == list(range(n))


def test_a_new_consumer_of_the_group_starts_after_the_committed_position(kafka_broker):
    n, partitions = 60, 2
    topic = kafka_broker.create_topic(partitions)
    kafka_broker.produce(topic, json_values(n), partition_of=lambda i: i % partitions)
    with KafkaStream(kafka_broker.bootstrap, topic, "committing") as a:
        durable, _ = read(a, 24, max_records=8)
        checkpoint = a.position()
        read(a, 10, max_records=8)   # trained after the checkpoint: not committed, so read again
        a.commit(checkpoint)
    with KafkaStream(kafka_broker.bootstrap, topic, "committing") as b:
        assert b.position() == checkpoint
        rest, _ = read(b, n - len(durable))
        assert_quiet(b)
    assert sorted(durable + rest) == list(range(n))
    with KafkaStream(kafka_broker.bootstrap, topic, "another-group") as c:   # from the earliest offset
        everything, _ = read(c, n)
    assert sorted(everything) == list(range(n))


def test_a_message_that_is_no_record_stops_the_stream_where_it_is_unless_skipped(kafka_broker):
    topic = kafka_broker.create_topic(1)
    kafka_broker.produce(topic, [b'{"id": 0}', b'{"id": 1}', b"[2]", b'{"id": 3}'], partition_of=lambda i: 0)
    with KafkaStream(kafka_broker.bootstrap, topic, "strict") as strict:
        ids = []
        with pytest.raises(KafkaStreamError, match=r"partition 0 offset 2 is not a json record.*errors=skip"):
            for _ in range(20):
                batch = strict.poll(1, timeout=1.0)
                ids += [] if batch is None else batch.records["id"].tolist()
        assert ids == [0, 1] and strict.position() == {"0": 2}
        with pytest.raises(KafkaStreamError, match="offset 2"):   # the same message again: nothing skipped
            strict.poll(10, timeout=5.0)
    with KafkaStream(kafka_broker.bootstrap, topic, "lenient", errors="skip") as lenient:
        ids, _ = read(lenient, 3)
        assert ids == [0, 1, 3] and lenient.skipped == 1 and lenient.position() == {"0": 4}


def test_a_wrong_topic_or_a_foreign_position_is_refused_with_what_to_do(kafka_broker):
    with pytest.raises(KafkaStreamError, match="create the topic"):
        KafkaStream(kafka_broker.bootstrap, "no-such-topic", "g", timeout=10)
    topic = kafka_broker.create_topic(4)
    with KafkaStream(kafka_broker.bootstrap, topic, "g", rank=1, world=2) as s:
        with pytest.raises(KafkaConfigError, match="partition 7, which the topic does not have"):
            s.seek({"1": 0, "3": 0, "7": 0})
        with pytest.raises(KafkaConfigError, match=r"does not name partition\(s\) \[3\].*union"):
            s.seek({"0": 0, "1": 0})   # only rank 0's and one of ours
        s.seek({"0": 9, "1": 0, "2": 9, "3": 0})   # the union of both ranks' positions
        assert s.position() == {"1": 0, "3": 0}


def test_a_broker_that_goes_away_is_an_error_within_the_deadline_not_a_hang(tmp_path, kafka_broker):
    from tests.engines.kafka import KafkaBroker

    own = KafkaBroker(tmp_path / "broker")   # this test stops it: not the session's broker
    try:
        topic = own.create_topic(2)
        own.produce(topic, json_values(10), partition_of=lambda i: i % 2)
        stream = KafkaStream(own.bootstrap, topic, "g", timeout=1)
        read(stream, 10)
    finally:
        own.close()
    started = time.monotonic()
    with pytest.raises(KafkaStreamError, match=rf"kafka://{own.bootstrap}/{topic}.*no answer within 1 s"):
        stream.commit(stream.position())
    with pytest.raises(KafkaStreamError, match=r"unanswered for \d+ s: no broker answers"):
        for _ in range(30):
            assert stream.poll(10, timeout=0.5) is None
    stream.close()
    # bounded by the 1 s timeout (a few of them), not by the client's own 45 s
    assert time.monotonic() - started < 20
