"""A Kafka topic as a StreamSource (paramshard.data.stream.source), exactly once.

Each trainer rank reads its own partitions, by manual assignment (partition p goes to rank
p % world), not by the group protocol: a rebalance would move partitions between trainers at
moments no checkpoint knows about, and then resuming could not be exact. The position is
``{partition: next offset}`` for this rank's partitions; ``seek`` assigns exactly those offsets,
and ``commit`` writes them to the consumer group only when the trainer says a checkpoint holding
them is durable (``enable.auto.commit`` is off). A new stream with no ``seek`` starts at the
group's committed offsets, or at the earliest offset for a partition the group never committed.

The topic's partitions are read once, when the stream opens: partitions added later are not
read until the job is restarted. A rank with no partition (world > partitions) gets no record.

Every wait has a deadline (the ``timeout`` option, default 30 s); errors name the brokers,
topic, group and rank and say what to do.
"""
from __future__ import annotations

import logging
import threading
import time

import pandas as pd

from paramshard.data.stream.kafka_config import KafkaConfigError, check_position, parse_options
from paramshard.data.stream.kafka_decode import (MessageError, csv_frame, decode_csv, decode_json,
                                                  json_frame)
from paramshard.data.stream.source import StreamBatch

log = logging.getLogger(__name__)


class KafkaStreamError(RuntimeError):
    """The broker, the topic or a message did not allow going on; the message says what to do."""


class KafkaStream:
    def __init__(self, brokers, topic, group, rank=0, world=1, format="json", **options):
        self.options = o = parse_options(brokers, topic, group, rank, world, format, **options)
        self.where = f"kafka://{o.brokers}/{o.topic} (group {o.group}, rank {o.rank} of {o.world})"
        try:
            import confluent_kafka as ck
        except ImportError as exc:
            raise KafkaStreamError(f"{self.where}: the Kafka client is not installed ({exc}): "
                                   "pip install 'paramshard[kafka]' (confluent-kafka)") from None
        self._ck = ck
        self.skipped = 0                        # messages dropped with errors=skip
        self._down_since: float | None = None   # when librdkafka last said every broker is down
        # the client's own log goes to Python logging (served by poll), not straight to stderr
        self._consumer = ck.Consumer({**o.consumer_config(), "error_cb": self._on_error},
                                     logger=logging.getLogger(__name__ + ".client"))
        self._closed = False
        self._committing: threading.Thread | None = None   # a commit that outlived its deadline
        self._commit_started = 0.0
        try:
            self.partitions = self._topic_partitions()
            self.mine = [p for p in self.partitions if p % o.world == o.rank]
            if not self.mine:
                log.warning("%s: the topic has %d partitions, none for this rank: it gets no record "
                            "(give the topic at least %d partitions)", self.where, len(self.partitions), o.world)
            self._next = self._start_offsets()
            self._assign()
        except BaseException:
            self.close()
            raise

    # -- the StreamSource protocol ------------------------------------------------------------
    def poll(self, max_records: int, timeout: float) -> StreamBatch | None:
        if max_records < 1:
            raise ValueError(f"{self.where}: poll(max_records={max_records}): need at least 1")
        self._check_open()
        if not self._commit_settled(timeout):
            return None
        first = self._consumer.poll(max(0.0, timeout))
        if first is None:
            self._check_brokers()
            return None
        messages = [first]
        if max_records > 1:   # what is already fetched, without waiting for more
            messages += self._consumer.consume(max_records - 1, 0)
        return self._batch(messages)

    def position(self) -> dict:
        return {str(p): off for p, off in sorted(self._next.items())}

    def seek(self, position: dict) -> None:
        """Continue at ``position``: this rank's partitions are taken from it (other ranks'
        partitions in it are ignored, so the union of every rank's positions serves each rank,
        also after the number of ranks changed); every partition of this rank must be there."""
        self._check_open()
        offsets = check_position(position, self.partitions, self.where)
        self._commit_settled(self.options.timeout)
        missing = [p for p in self.mine if p not in offsets]
        if missing:
            raise KafkaConfigError(
                f"{self.where}: the position does not name partition(s) {missing} of this rank: give seek the "
                "union of every rank's positions (each rank's position names only its own partitions)")
        self._next = {p: offsets[p] for p in self.mine}
        self._assign()

    def commit(self, position: dict) -> None:
        """Commit this rank's offsets of ``position`` to the group (other ranks commit theirs)."""
        self._check_open()
        offsets = check_position(position, self.partitions, self.where)
        mine = [self._ck.TopicPartition(self.options.topic, p, off) for p, off in sorted(offsets.items())
                if p in self.mine]
        if not mine:
            return
        # librdkafka's synchronous commit has no deadline of its own (45 s measured with the broker
        # gone): it runs in a thread the caller waits for at most `timeout`. Commits stay in order:
        # one still in flight is waited for first, so the group's offset never moves back.
        timeout = self.options.timeout
        if not self._commit_settled(timeout):
            raise KafkaStreamError(f"{self.where}: the previous commit is still unanswered: check the broker; "
                                   "the checkpoint is durable, so a resume from it is still exact")
        result: dict = {}

        def run():
            try:
                result["done"] = self._consumer.commit(offsets=mine, asynchronous=False)
            except self._ck.KafkaException as exc:
                result["error"] = exc

        thread = threading.Thread(target=run, name="kafka-commit", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            self._committing, self._commit_started = thread, time.monotonic() - timeout
            raise KafkaStreamError(f"{self.where}: committing offsets {self._show(mine)}: no answer within "
                                   f"{timeout:g} s: check the broker; the checkpoint is durable, so a resume from "
                                   "it is still exact (a later commit goes after this one)")
        if "error" in result:
            raise KafkaStreamError(f"{self.where}: committing offsets {self._show(mine)} failed: {result['error']}; "
                                   "the checkpoint is durable, so the next commit or a resume from it "
                                   "is still exact: check the broker")
        done = result.get("done")
        failed = [tp for tp in done or () if tp.error is not None]
        if failed:
            raise KafkaStreamError(f"{self.where}: the broker refused offsets {self._show(failed)}: "
                                   f"{failed[0].error}; check the group and the broker")

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self._committing is not None:   # closing under a commit in flight is not safe in the client
            self._committing.join(self.options.timeout)
            if self._committing.is_alive():
                log.warning("%s: a commit is still unanswered: the consumer is left to the process's exit", self.where)
                return
        try:
            self._consumer.close()   # no commit: enable.auto.commit is off
        except RuntimeError:
            pass   # already closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- inside ---------------------------------------------------------------------------------
    def _batch(self, messages) -> StreamBatch | None:
        o = self.options
        nxt = dict(self._next)
        decoded: list = []   # dicts (json) or lists of fields (csv)
        stamps = []
        for m in messages:
            err = m.error()
            if err is not None:
                if err.code() == self._ck.KafkaError._PARTITION_EOF:
                    continue
                self._assign()   # rewind to what was handed out: nothing of this batch is lost
                raise KafkaStreamError(f"{self.where}: partition {m.partition()}: {err.str()}; "
                                       + self._advice(err))
            p, off = m.partition(), m.offset()
            if p not in nxt or off < nxt[p]:
                continue   # not ours, or before the position (never hand out a record twice)
            try:
                record = decode_csv(m.value(), o.columns) if o.format == "csv" else decode_json(m.value())
            except MessageError as exc:
                if o.errors == "raise":
                    self._assign()
                    raise KafkaStreamError(f"{self.where}: the message at partition {p} offset {off} is not a "
                                           f"{o.format} record: {exc}; fix the producer, or open the stream with "
                                           "errors=skip to drop such messages") from None
                self.skipped += 1
                log.warning("%s: skipped the message at partition %d offset %d: %s", self.where, p, off, exc)
                nxt[p] = off + 1
                continue
            nxt[p] = off + 1   # a gap (compaction, transaction markers) is fine: offsets only grow
            decoded.append(record)
            kind, ms = m.timestamp()
            if kind != self._ck.TIMESTAMP_NOT_AVAILABLE and ms >= 0:
                stamps.append(ms / 1000.0)
        self._next = nxt
        self._down_since = None
        if not decoded:
            return None
        records: pd.DataFrame = csv_frame(decoded, o.columns) if o.format == "csv" else json_frame(decoded)
        return StreamBatch(records=records, position=self.position(), arrived=min(stamps) if stamps else None)

    def _topic_partitions(self) -> list[int]:
        o = self.options
        try:
            meta = self._consumer.list_topics(o.topic, timeout=o.timeout)
        except self._ck.KafkaException as exc:
            raise KafkaStreamError(f"{self.where}: no answer from the brokers within {o.timeout:g} s ({exc}): "
                                   "is the broker running, and are host and port right?") from None
        topic = meta.topics.get(o.topic)
        if topic is None or topic.error is not None:
            why = topic.error.str() if topic is not None else "not in the metadata"
            raise KafkaStreamError(f"{self.where}: topic {o.topic!r}: {why}: create the topic (with at least "
                                   f"{o.world} partitions) or correct its name")
        return sorted(topic.partitions)

    def _start_offsets(self) -> dict[int, int]:
        """The group's committed offset of each partition of this rank, else its earliest."""
        o, ck = self.options, self._ck
        if not self.mine:
            return {}
        try:
            committed = self._consumer.committed([ck.TopicPartition(o.topic, p) for p in self.mine],
                                                 timeout=o.timeout)
            start = {}
            for tp in committed:
                if tp.error is not None:
                    raise ck.KafkaException(tp.error)
                if tp.offset >= 0:
                    start[tp.partition] = tp.offset
                else:   # never committed by this group: from the beginning of what the topic keeps
                    start[tp.partition] = self._consumer.get_watermark_offsets(
                        ck.TopicPartition(o.topic, tp.partition), timeout=o.timeout)[0]
        except ck.KafkaException as exc:
            raise KafkaStreamError(f"{self.where}: reading the group's committed offsets failed within "
                                   f"{o.timeout:g} s: {exc}; check that the broker is up") from None
        return start

    def _assign(self) -> None:
        tps = [self._ck.TopicPartition(self.options.topic, p, off) for p, off in sorted(self._next.items())]
        self._consumer.assign(tps)   # replaces the assignment and drops what was fetched before

    def _commit_settled(self, wait: float) -> bool:
        """Wait up to ``wait`` s for a commit that outlived its deadline: while it is in flight the
        client blocks every other call (a poll took 44 s behind one, broker gone). False if it
        still runs; an error once it has run for over twice the timeout."""
        if self._committing is None:
            return True
        self._committing.join(max(0.0, wait))
        if not self._committing.is_alive():
            self._committing = None
            return True
        age = time.monotonic() - self._commit_started
        if age > 2 * self.options.timeout:
            raise KafkaStreamError(f"{self.where}: a commit has been unanswered for {age:.0f} s: no broker answers; "
                                   "start the broker or correct the URL, then resume from the last checkpoint "
                                   "(its position loses and repeats nothing)")
        return False

    def _on_error(self, err) -> None:
        if err.code() == self._ck.KafkaError._ALL_BROKERS_DOWN:
            if self._down_since is None:
                self._down_since = time.monotonic()
        elif err.fatal():
            log.error("%s: fatal client error: %s", self.where, err.str())

    def _check_brokers(self) -> None:
        """No record came: fail once no broker answered for longer than the timeout (a live
        stream may be quiet, but a stream whose brokers are gone must not wait forever)."""
        if self._down_since is None or time.monotonic() - self._down_since <= self.options.timeout:
            return
        try:
            self._consumer.list_topics(self.options.topic, timeout=min(5.0, self.options.timeout))
            self._down_since = None   # back again
        except self._ck.KafkaException as exc:
            raise KafkaStreamError(f"{self.where}: no broker answered for over {self.options.timeout:g} s "
                                   f"({exc}): start the broker or correct the URL; resume from the last "
                                   "checkpoint's position loses and repeats nothing") from None

    def _advice(self, err) -> str:
        if err.code() in (self._ck.KafkaError.OFFSET_OUT_OF_RANGE, self._ck.KafkaError._AUTO_OFFSET_RESET):
            return ("the position's offset is no longer (or not yet) in the topic: records were deleted by "
                    "retention, or the position is from another topic or cluster")
        return "check the broker and the topic"

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaStreamError(f"{self.where}: the stream is closed")

    @staticmethod
    def _show(tps) -> str:
        return ", ".join(f"{tp.partition}@{tp.offset}" for tp in tps)
