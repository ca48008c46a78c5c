"""open_stream: a spec to its StreamSource."""
import sys

import pytest

from paramshard.data import DirectoryStream, open_stream
from paramshard.data.stream.open import parse_kafka
from paramshard.errors import ConfigError


def test_a_directory_or_file_url_opens_a_directory_stream(tmp_path, monkeypatch):
    stream = open_stream(str(tmp_path), 1, 2, format="jsonl")
    assert isinstance(stream, DirectoryStream) and (stream.rank, stream.world, stream.format) == (1, 2, "jsonl")
    assert open_stream(f"file://{tmp_path}").root == str(tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    assert open_stream(f"file://{tmp_path.name}").root == tmp_path.name      # file://relative/dir


def test_an_unknown_scheme_lists_the_accepted_forms(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown scheme 'http'.*DIR .*file://DIR.*kafka://BROKER"):
        open_stream("http://example.invalid/x")


def test_kafka_specs_are_parsed():
    assert parse_kafka("kafka://b1:9092,b2:9092/clicks?group=ctr") == ("b1:9092,b2:9092", "clicks", "ctr")
    assert parse_kafka("kafka://localhost:9092/clicks") == ("localhost:9092", "clicks", "paramshard")
    for bad in ("kafka://localhost:9092/", "kafka:///clicks", "kafka://b/clicks?grop=x", "kafka://b/a/b"):
        with pytest.raises(ConfigError, match="kafka://BROKER"):
            parse_kafka(bad)


def test_kafka_without_its_module_says_the_extra_is_needed(monkeypatch):
    monkeypatch.setitem(sys.modules, "paramshard.data.stream.kafka", None)    # as if not installed
    with pytest.raises(ConfigError, match=r"Kafka extra .*confluent-kafka"):
        open_stream("kafka://localhost:9092/clicks?group=ctr", 0, 1)
