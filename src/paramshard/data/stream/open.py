"""``open_stream(spec, rank, world, **options)``: the StreamSource a spec names (the CTR app's
``--stream``).

    open_stream("data/live", 0, 2)                       # a directory: DirectoryStream
    open_stream("file:///srv/events", 0, 2, format="jsonl")
    open_stream("kafka://localhost:9092/clicks?group=ctr", 0, 2)   # KafkaStream (the Kafka extra)

``options`` go to the source's constructor (DirectoryStream: format, time_column, delimiter).
"""
from __future__ import annotations

import importlib
import urllib.parse

from paramshard.errors import ConfigError

FORMS = ("DIR (a directory of CSV, JSON-lines or Parquet files)", "file://DIR",
         "kafka://BROKER[,BROKER...]/TOPIC?group=GROUP")
DEFAULT_GROUP = "paramshard"


def open_stream(spec: str, rank: int = 0, world: int = 1, **options):
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"a stream spec must be one of: {'; '.join(FORMS)}; got {spec!r}")
    if spec.startswith("kafka://"):
        brokers, topic, group = parse_kafka(spec)
        try:        # imported here: only a Kafka job needs the client (and this module)
            kafka = importlib.import_module("paramshard.data.stream.kafka")
        except ModuleNotFoundError as exc:
            if exc.name in ("paramshard.data.stream.kafka", "confluent_kafka"):
                raise ConfigError(f"{spec}: Kafka streams need the Kafka extra (the confluent-kafka client): "
                                  f"pip install 'paramshard[kafka]' ({exc})") from None
            raise
        return kafka.KafkaStream(brokers, topic, group, rank, world, **options)
    if spec.startswith("file://"):
        path = urllib.parse.unquote(spec[len("file://"):])     # file:///abs/dir, or file://relative/dir
    elif "://" in spec:
        raise ConfigError(f"stream {spec!r}: unknown scheme {spec.split('://')[0]!r}; the accepted forms: "
                          f"{'; '.join(FORMS)}")
    else:
        path = spec
    from paramshard.data.stream.directory import DirectoryStream
    return DirectoryStream(path, rank, world, **options)


def parse_kafka(spec: str) -> tuple[str, str, str]:
    """(brokers, topic, group) of ``kafka://BROKER[,BROKER]/TOPIC?group=G`` (group: paramshard)."""
    parts = urllib.parse.urlsplit(spec)
    topic = parts.path.strip("/")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - {"group"}
    if not parts.netloc or not topic or "/" in topic or unknown or parts.fragment:
        why = f"unknown parameters {sorted(unknown)}" if unknown else "it needs a broker and one topic"
        raise ConfigError(f"stream {spec!r}: {why}; the form is kafka://BROKER[,BROKER...]/TOPIC?group=GROUP")
    group = query.get("group", [DEFAULT_GROUP])[-1]
    if not group:
        raise ConfigError(f"stream {spec!r}: group= is empty; name the consumer group (kafka://.../TOPIC?group=ctr)")
    return parts.netloc, topic, group
