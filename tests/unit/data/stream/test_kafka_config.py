"""The Kafka stream's URL and options, message decoding and position checks: no broker needed."""
import math

import pandas as pd
import pytest

from paramshard.data.stream.kafka_config import KafkaConfigError, check_position, parse_options, parse_url
from paramshard.data.stream.kafka_decode import MessageError, csv_frame, decode_csv, decode_json, json_frame


def test_a_url_gives_the_constructor_arguments_and_librdkafka_settings():
    kwargs = parse_url("kafka://127.0.0.1:9092,10.0.0.2:9093/clicks?group=ctr&format=csv&columns=label,c1,c2"
                       "&timeout=5&security.protocol=PLAINTEXT")
    assert kwargs == {"brokers": "127.0.0.1:9092,10.0.0.2:9093", "topic": "clicks", "group": "ctr", "format": "csv",
                      "columns": "label,c1,c2", "timeout": "5", "security.protocol": "PLAINTEXT"}
    o = parse_options(rank=1, world=2, **kwargs)
    assert (o.brokers, o.topic, o.group, o.rank, o.world) == ("127.0.0.1:9092,10.0.0.2:9093", "clicks", "ctr", 1, 2)
    assert o.columns == ("label", "c1", "c2") and o.timeout == 5.0 and o.errors == "raise"
    config = o.consumer_config()
    assert config["security.protocol"] == "PLAINTEXT" and config["group.id"] == "ctr"
    assert config["enable.auto.commit"] is False and config["enable.auto.offset.store"] is False


@pytest.mark.parametrize("url, says", [
    ("file:///x", "not a kafka:// URL"),
    ("kafka:///clicks?group=g", "no broker"),
    ("kafka://host/clicks?group=g", "not HOST:PORT"),
    ("kafka://host:99999/clicks?group=g", "not HOST:PORT"),
    ("kafka://h:9092/?group=g", "not a topic name"),
    ("kafka://h:9092/a/b?group=g", "not a topic name"),
    ("kafka://h:9092/clicks", "no consumer group"),
    ("kafka://h:9092/clicks?group=g&group=h", "given twice"),
    ("kafka://h:9092/clicks?group=g&rank=1", "comes from the URL's place or the job"),
    ("kafka://h:9092/clicks?group=g&format=avro", "format 'avro'"),
    ("kafka://h:9092/clicks?group=g&format=csv", "needs the header"),
    ("kafka://h:9092/clicks?group=g&format=csv&columns=a,a", "repeated"),
    ("kafka://h:9092/clicks?group=g&columns=a,b", "is for format=csv"),
    ("kafka://h:9092/clicks?group=g&timeout=0", "seconds > 0"),
    ("kafka://h:9092/clicks?group=g&timeout=soon", "seconds > 0"),
    ("kafka://h:9092/clicks?group=g&errors=ignore", "raise or skip"),
    ("kafka://h:9092/clicks?group=g&batch=5", "unknown option 'batch'"),
    ("kafka://h:9092/clicks?group=g&enable.auto.commit=true", "set by the stream itself"),
])
def test_a_bad_url_is_refused_saying_what_to_change(url, says):
    with pytest.raises(KafkaConfigError, match=says):
        parse_url(url)


@pytest.mark.parametrize("rank, world", [(2, 2), (-1, 2), (0, 0), ("x", 1), (1.5, 2)])
def test_rank_and_world_are_checked(rank, world):
    with pytest.raises(KafkaConfigError, match="rank|world"):
        parse_options("h:1", "t", "g", rank, world)


def test_brokers_may_be_a_list_and_columns_a_list():
    o = parse_options(["a:1", "b:2"], "t", "g", format="CSV", columns=["x", "y"], timeout=math.pi)
    assert o.brokers == "a:1,b:2" and o.format == "csv" and o.columns == ("x", "y")


def test_json_messages_are_one_object_each():
    assert decode_json(b'{"label": 1, "c1": "a"}') == {"label": 1, "c1": "a"}
    for value, says in [(b"[1, 2]", "not an object"), (b"{", "not JSON"), (None, "no value"),
                        (b"\xff\xfe", "not JSON")]:
        with pytest.raises(MessageError, match=says):
            decode_json(value)


def test_json_columns_are_the_union_in_first_seen_order():
    frame = json_frame([{"a": 1, "b": "x"}, {"b": "y", "c": 2.5}])
    assert list(frame.columns) == ["a", "b", "c"]
    assert frame["b"].tolist() == ["x", "y"] and frame["a"].isna().tolist() == [False, True]
    assert json_frame([]).empty


def test_csv_lines_are_split_by_the_header_and_numbers_become_numeric():
    columns = ("label", "i1", "c1")
    rows = [decode_csv(b"1,3,ab\n", columns), decode_csv(b'0,,"x,y"', columns)]
    frame = csv_frame(rows, columns)
    assert frame["label"].tolist() == [1, 0] and pd.api.types.is_integer_dtype(frame["label"])
    assert frame["i1"].iloc[0] == 3 and math.isnan(frame["i1"].iloc[1])
    assert frame["c1"].tolist() == ["ab", "x,y"]


@pytest.mark.parametrize("value, says", [(b"1,2", "2 fields where the header has 3"),
                                         (b"1,2,3,4", "4 fields"), (b"1,2,3\n4,5,6", "2 lines"),
                                         (b"\xff,1,2", "not UTF-8"), (None, "no value")])
def test_a_bad_csv_message_says_what_is_wrong(value, says):
    with pytest.raises(MessageError, match=says):
        decode_csv(value, ("a", "b", "c"))


def test_a_position_after_a_json_round_trip_is_the_same_position():
    assert check_position({"0": 5, "3": 0}, [0, 1, 2, 3], "here") == {0: 5, 3: 0}
    assert check_position({2: 7}, [0, 1, 2], "here") == {2: 7}
    assert check_position({}, [0], "here") == {}


@pytest.mark.parametrize("position, says", [
    ([0, 5], "is a {partition: next offset} object, got list"),
    ("0:5", "got str"),
    ({"p0": 5}, "not a partition number"),
    ({"01": 5}, "not a partition number"),
    ({"-1": 5}, "does not have"),
    ({"4": 5}, "names partition 4, which the topic does not have"),
    ({"0": -1}, "need an int >= 0"),
    ({"0": 1.5}, "need an int >= 0"),
    ({"0": "5"}, "need an int >= 0"),
    ({"0": True}, "need an int >= 0"),
    ({"0": None}, "need an int >= 0"),
    ({"0": 1, 0: 2}, "appears twice"),
])
def test_a_damaged_position_is_a_clear_error(position, says):
    with pytest.raises(KafkaConfigError, match=says) as info:
        check_position(position, [0, 1, 2, 3], "kafka://h:1/t (group g, rank 0 of 1)")
    assert "kafka://h:1/t" in str(info.value)


def test_without_the_client_the_stream_says_what_to_install(monkeypatch):
    from paramshard.data.stream.kafka import KafkaStream, KafkaStreamError

    monkeypatch.setitem(__import__("sys").modules, "confluent_kafka", None)   # import fails
    with pytest.raises(KafkaStreamError, match=r"kafka://h:1/t .*pip install 'paramshard\[kafka\]'"):
        KafkaStream("h:1", "t", "g")
    with pytest.raises(KafkaConfigError, match="no consumer group"):   # checked before the client is needed
        KafkaStream("h:1", "t", "")
