"""open_stream: a spec to its StreamSource."""
import sys

import pytest

from paramshard.data import DirectoryStream, open_stream
from paramshard.errors import ConfigError


def test_a_directory_or_file_url_opens_a_directory_stream(tmp_path, monkeypatch):
    stream = open_stream(str(tmp_path), 1, 2, format="jsonl")
    assert isinstance(stream, DirectoryStream) and (stream.rank, stream.world, stream.format) == (1, 2, "jsonl")
    assert open_stream(f"file://{tmp_path}").root == str(tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    assert open_stream(f"file://{tmp_path.name}").root == tmp_path.name      # file://relative/dir


def test_an_unknown_scheme_lists_the_accepted_forms(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown scheme 'http'.*DIR .*file://DIR.*kafka://HOST:PORT"):
        open_stream("http://example.invalid/x")


def test_a_kafka_url_opens_a_kafka_stream_with_the_rank_and_options(monkeypatch):
    from paramshard.data.stream import kafka
    made = []
    monkeypatch.setattr(kafka, "KafkaStream", lambda **kwargs: made.append(kwargs) or "stream")
    assert open_stream("kafka://b1:9092,b2:9092/clicks?group=ctr", 1, 2, timeout=5) == "stream"
    assert made == [{"brokers": "b1:9092,b2:9092", "topic": "clicks", "group": "ctr", "rank": 1, "world": 2,
                     "timeout": 5}]
    with pytest.raises(ValueError, match="no consumer group"):
        open_stream("kafka://b1:9092/clicks", 0, 1)


def test_kafka_without_its_module_says_the_extra_is_needed(monkeypatch):
    monkeypatch.setitem(sys.modules, "paramshard.data.stream.kafka", None)    # as if not installed
    with pytest.raises(ConfigError, match=r"Kafka extra .*confluent-kafka"):
        open_stream("kafka://localhost:9092/clicks?group=ctr", 0, 1)
