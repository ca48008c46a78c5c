"""What a Kafka stream is told, checked before any socket opens: the ``kafka://`` URL, the
options of :class:`~paramshard.data.stream.kafka.KafkaStream`, and the positions a checkpoint
hands back. Nothing here imports the Kafka client, so it is usable (and tested) without one.

URL: ``kafka://HOST:PORT[,HOST:PORT...]/TOPIC?group=G[&format=json|csv][&columns=a,b,c]
[&timeout=S][&errors=raise|skip][&librdkafka.name=value...]``. A query key with a dot is a
librdkafka setting passed to the consumer as is (``security.protocol=SSL``, ...).

A position is ``{partition: next offset}`` for the partitions of one rank, with the partitions
as strings (JSON object keys) or ints: the offset of the first record *not* yet handed out.
"""
from __future__ import annotations

import dataclasses
import math
import urllib.parse

FORMATS = ("json", "csv")
ERRORS = ("raise", "skip")
DEFAULT_TIMEOUT = 30.0   # seconds: metadata, committed offsets, commits, a broker unreachable

# librdkafka settings this source owns: exactly-once needs them as they are.
_OWNED = {"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store",
          "auto.offset.reset"}


class KafkaConfigError(ValueError):
    """A Kafka URL, option or position that cannot be used; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class KafkaOptions:
    brokers: str                          # "host:port,host:port" (librdkafka bootstrap.servers)
    topic: str
    group: str
    rank: int = 0
    world: int = 1
    format: str = "json"
    columns: tuple[str, ...] = ()         # the CSV header (format=csv only)
    timeout: float = DEFAULT_TIMEOUT
    errors: str = "raise"                 # a message that does not decode: raise, or skip it
    client: tuple[tuple[str, str], ...] = ()   # extra librdkafka settings

    def consumer_config(self) -> dict[str, object]:
        config: dict[str, object] = dict(self.client)
        config.update({
            "bootstrap.servers": self.brokers,
            "group.id": self.group,
            # Offsets are committed only by commit(): after a checkpoint holding them is durable.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Every start offset is given explicitly (seek or committed or earliest); this only
            # decides what happens if one has been deleted by retention meanwhile: fail loudly.
            "auto.offset.reset": "error",
        })
        return config


def parse_options(brokers, topic, group, rank=0, world=1, format="json", **options) -> KafkaOptions:
    """Check the constructor's arguments; ``options`` as strings (from a URL) or typed values."""
    if isinstance(brokers, (list, tuple)):
        brokers = ",".join(str(b) for b in brokers)
    brokers = str(brokers or "").strip()
    where = f"kafka://{brokers}/{topic}"
    for broker in filter(None, (b.strip() for b in brokers.split(","))):
        host, sep, port = broker.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise KafkaConfigError(f"{where}: broker {broker!r} is not HOST:PORT (e.g. 127.0.0.1:9092)")
    if not brokers:
        raise KafkaConfigError(f"{where}: no broker given: name one as HOST:PORT (kafka://HOST:PORT/TOPIC?group=G)")
    if not topic or not isinstance(topic, str) or "/" in topic:
        raise KafkaConfigError(f"{where}: the topic {topic!r} is not a topic name (kafka://HOST:PORT/TOPIC?group=G)")
    if not group or not isinstance(group, str):
        raise KafkaConfigError(f"{where}: no consumer group: add ?group=NAME (offsets are committed to it)")
    rank, world = _int("rank", rank, where), _int("world", world, where)
    if world < 1 or not 0 <= rank < world:
        raise KafkaConfigError(f"{where}: rank {rank} of world {world}: need 0 <= rank < world")
    format = str(format).lower()
    if format not in FORMATS:
        raise KafkaConfigError(f"{where}: format {format!r}: use one of {', '.join(FORMATS)}")
    columns = options.pop("columns", ())
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",")] if columns.strip() else []
    columns = tuple(str(c) for c in columns)
    if format == "csv" and not columns:
        raise KafkaConfigError(f"{where}: format=csv needs the header: columns=a,b,c")
    if format == "csv" and (len(set(columns)) != len(columns) or "" in columns):
        raise KafkaConfigError(f"{where}: columns {list(columns)} has an empty or repeated name")
    if format != "csv" and columns:
        raise KafkaConfigError(f"{where}: columns= is for format=csv (JSON messages name their fields)")
    timeout = options.pop("timeout", DEFAULT_TIMEOUT)
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        timeout = float("nan")
    if not math.isfinite(timeout) or timeout <= 0:
        raise KafkaConfigError(f"{where}: timeout={options.get('timeout', timeout)!r}: give seconds > 0")
    errors = str(options.pop("errors", "raise")).lower()
    if errors not in ERRORS:
        raise KafkaConfigError(f"{where}: errors={errors!r}: use raise or skip")
    client = {}
    for key, value in options.items():
        if "." not in key:
            raise KafkaConfigError(f"{where}: unknown option {key!r}: the options are group, format, columns, "
                                   "timeout, errors, and librdkafka settings (names with a dot)")
        if key in _OWNED:
            raise KafkaConfigError(f"{where}: {key} is set by the stream itself (exactly-once needs it): remove it")
        client[key] = str(value)
    return KafkaOptions(brokers, topic, group, rank, world, format, columns, timeout, errors,
                        tuple(sorted(client.items())))


def parse_url(url: str) -> dict:
    """``kafka://BROKERS/TOPIC?group=G&...`` -> the keyword arguments of KafkaStream (less rank
    and world), checked the same way as the constructor's."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "kafka":
        raise KafkaConfigError(f"{url!r} is not a kafka:// URL (kafka://HOST:PORT/TOPIC?group=G)")
    topic = urllib.parse.unquote(parts.path.lstrip("/"))
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False)
    kwargs: dict = {}
    for key, value in query:
        if key in kwargs:
            raise KafkaConfigError(f"{url!r}: {key} is given twice")
        if key in ("brokers", "topic", "rank", "world"):
            raise KafkaConfigError(f"{url!r}: {key} comes from the URL's place or the job, not from ?{key}=")
        kwargs[key] = value
    kwargs = {"brokers": parts.netloc, "topic": topic, "group": kwargs.pop("group", ""), **kwargs}
    parse_options(**kwargs)   # the same checks, so a bad URL fails before a consumer is made
    return kwargs


def check_position(position, partitions, where: str) -> dict[int, int]:
    """``position`` as {partition: next offset} with int keys, checked: a damaged or foreign
    position is an error that says what is wrong, never a silent restart from elsewhere.
    ``partitions``: every partition the topic has (a position may name any of them: the union
    of all ranks' positions is a valid position for each rank)."""
    if not isinstance(position, dict):
        raise KafkaConfigError(f"{where}: a position is a {{partition: next offset}} object, got "
                               f"{type(position).__name__}: is the checkpoint's stream position damaged?")
    known = set(partitions)
    checked: dict[int, int] = {}
    for key, offset in position.items():
        try:
            partition = int(key)
            if isinstance(key, bool) or str(partition) != str(key).strip():
                raise ValueError
        except (TypeError, ValueError):
            raise KafkaConfigError(f"{where}: position key {key!r} is not a partition number: "
                                   "is the checkpoint's stream position damaged?") from None
        if partition not in known:
            raise KafkaConfigError(f"{where}: the position names partition {partition}, which the topic does not "
                                   f"have (it has {len(known)}): is it the position of another topic?")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise KafkaConfigError(f"{where}: partition {partition} has offset {offset!r} in the position: "
                                   "need an int >= 0 (is the checkpoint's stream position damaged?)")
        if partition in checked:
            raise KafkaConfigError(f"{where}: partition {partition} appears twice in the position")
        checked[partition] = offset
    return checked


def _int(name: str, value, where: str) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise KafkaConfigError(f"{where}: {name}={value!r} is not an integer") from None
