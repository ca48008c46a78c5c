"""``open_stream(spec, rank, world, **options)``: the StreamSource a spec names (the CTR app's
``--stream``).

    open_stream("data/live", 0, 2)                       # a directory: DirectoryStream
    open_stream("file:///srv/events", 0, 2, format="jsonl")
    open_stream("kafka://localhost:9092/clicks?group=ctr", 0, 2)   # KafkaStream (the Kafka extra)

``options`` go to the source's constructor (DirectoryStream: format, time_column, delimiter;
KafkaStream: see data/stream/kafka.py; a Kafka URL's query is checked by kafka_config.parse_url).
"""
from __future__ import annotations

import importlib
import urllib.parse

from paramshard.errors import ConfigError

FORMS = ("DIR (a directory of CSV, JSON-lines or Parquet files)", "file://DIR",
         "kafka://HOST:PORT[,HOST:PORT...]/TOPIC?group=GROUP[&format=csv&columns=...]")


def open_stream(spec: str, rank: int = 0, world: int = 1, **options):
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"a stream spec must be one of: {'; '.join(FORMS)}; got {spec!r}")
    if spec.startswith("kafka://"):
        try:        # imported here: only a Kafka job needs the client (and these modules)
            config = importlib.import_module("paramshard.data.stream.kafka_config")
            kafka = importlib.import_module("paramshard.data.stream.kafka")
        except ModuleNotFoundError as exc:
            if exc.name in ("paramshard.data.stream.kafka", "paramshard.data.stream.kafka_config", "confluent_kafka"):
                raise ConfigError(f"{spec}: Kafka streams need the Kafka extra (the confluent-kafka client): "
                                  f"pip install 'paramshard[kafka]' ({exc})") from None
            raise
        kwargs = config.parse_url(spec)     # checked: a bad URL says what to change
        return kafka.KafkaStream(rank=rank, world=world, **{**kwargs, **options})
    if spec.startswith("file://"):
        path = urllib.parse.unquote(spec[len("file://"):])     # file:///abs/dir, or file://relative/dir
    elif "://" in spec:
        raise ConfigError(f"stream {spec!r}: unknown scheme {spec.split('://')[0]!r}; the accepted forms: "
                          f"{'; '.join(FORMS)}")
    else:
        path = spec
    from paramshard.data.stream.directory import DirectoryStream
    return DirectoryStream(path, rank, world, **options)

