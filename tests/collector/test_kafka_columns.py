"""The ``from = "kafka_*"`` columns: config checks, the ingestor's Kafka meta, the decode.

The Kafka listener itself is tested with the listener; here its contract with the rest is:
:func:`ingestor.mappings.kafka_meta` is what it puts under ``"kf"`` in each record's
envelope meta, and the pipeline turns that into columns (null for HTTP/gRPC events).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from icefloe.config import Column, Config, StreamConfig, load_config, validate
from icefloe.errors import ConfigError
from icefloe.formats.batch import BatchBuilder
from icefloe.formats.envelope import frame_encoded, frame_events
from icefloe.registry.model import computed_later, unversioned_change
from icefloe.streams.mappings import KAFKA_META_KEYS, KAFKA_SOURCES, META_KAFKA
from ingestor.mappings import (
    check_kafka_key,
    kafka_key_text,
    kafka_meta,
    kafka_meta_wanted,
)
from pipeline.load.decode import decode_batch_file
from pipeline.load.kafka_meta import b64decode_column
from pipeline.load.mapped import add_derived
from pipeline.load.spec import EntryFile, StreamPlan, stream_specs

UTC = dt.UTC
KAFKA = StreamConfig(name="s", table="a.b", columns=(
    Column("a", "long"),
    Column("key", "string", source="kafka_key"),
    Column("key_bytes", "binary", source="kafka_key"),
    Column("headers", "json", source="kafka_headers"),
    Column("partition", "int", source="kafka_partition"),
    Column("partition_long", "long", source="kafka_partition"),
    Column("at", "timestamp", source="kafka_timestamp"),
    Column("at_ms", "long", source="kafka_timestamp"),
    Column("day", "date", source="kafka_timestamp"),
    Column("offset", "long", source="kafka_offset"),
    Column("topic", "string", source="kafka_topic"),
))
TS_MS = 1_700_000_000_005  # 2023-11-14T22:13:20.005Z


# -- config -------------------------------------------------------------------------------


def config_error(tmp_path: Path, column: str) -> str:
    """Load a TOML file whose stream has ``column`` (an inline table); return the error."""
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "s"\ntable = "a.b"\ncolumns = [\n'
                    f'  {{ name = "url", type = "string" }},\n  {column},\n]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


@pytest.mark.parametrize(("column", "expected"), [
    ('{ name = "x", type = "long", from = "kafka_key" }',
     "from = 'kafka_key' gives string or binary, not long"),
    ('{ name = "x", type = "long", from = "kafka_headers" }',
     "from = 'kafka_headers' gives json or string, not long"),
    ('{ name = "x", type = "string", from = "kafka_partition" }',
     "from = 'kafka_partition' gives int or long, not string"),
    ('{ name = "x", type = "string", from = "kafka_timestamp" }',
     "from = 'kafka_timestamp' gives timestamp or long or date, not string"),
    ('{ name = "x", type = "int", from = "kafka_offset" }',
     "from = 'kafka_offset' gives long, not int"),
    ('{ name = "x", type = "json", from = "kafka_topic" }',
     "from = 'kafka_topic' gives string, not json"),
    ('{ name = "x", type = "string", from = "kafka_topic", required = true }',
     "from = 'kafka_topic' cannot be required: only events that arrive through the Kafka "
     "listener have it (it is null for events sent over HTTP or gRPC); drop 'required'"),
    ('{ name = "x", type = "string", from = "kafka" }', "kafka_key, kafka_headers"),
])
def test_a_bad_kafka_column_fails_at_load_with_the_column_source_and_types(
        tmp_path: Path, column: str, expected: str) -> None:
    message = config_error(tmp_path, column)
    assert "icefloe.toml: streams[0].columns[1] (x): " in message, message
    assert expected in message, message


def test_every_allowed_kafka_column_type_loads() -> None:
    validate(Config(streams=(KAFKA,)), "test")
    with pytest.raises(ConfigError, match=r"columns\[1\] \(k\): from = 'kafka_key' cannot"):
        validate(Config(streams=(StreamConfig(name="s", table="a.b", columns=(
            Column("a", "long"), Column("k", "binary", source="kafka_key", required=True),
        )),)), "test")


def test_kafka_columns_are_computed_by_the_collector_so_their_mapping_is_fixed() -> None:
    topic = Column("t", "string", source="kafka_topic")
    assert all(computed_later(Column("c", "long", source=s)) for s in KAFKA_SOURCES)
    assert unversioned_change(topic, Column("t", "string", source="kafka_key"))
    assert unversioned_change(topic, Column("t", "string"))
    assert unversioned_change(Column("t", "string", source="ip"), topic)
    assert not unversioned_change(topic, topic)


# -- the ingestor's half: what the listener puts in the meta ------------------------------


def test_only_streams_with_a_kafka_column_want_the_kafka_meta() -> None:
    plain = StreamConfig(name="p", table="a.b", columns=(
        Column("a", "long"), Column("ip", "string", source="ip")))
    binary = StreamConfig(name="b", table="a.b", columns=(
        Column("k", "binary", source="kafka_key"),))
    assert [kafka_meta_wanted(s) for s in (KAFKA, binary, plain)] == [True, True, False]
    assert [kafka_key_text(s) for s in (KAFKA, binary, plain)] == [True, False, False]


def test_a_key_that_is_not_utf8_is_refused_only_for_a_string_key_column() -> None:
    binary = StreamConfig(name="b", table="a.b", columns=(
        Column("k", "binary", source="kafka_key"),))
    assert check_kafka_key(KAFKA, "ключ".encode()) is None
    assert check_kafka_key(KAFKA, None) is None
    assert check_kafka_key(KAFKA, b"") is None
    assert check_kafka_key(binary, b"\xff\xfe") is None
    reason = check_kafka_key(KAFKA, b"ok\xff")
    assert reason == ('column key (from = "kafka_key") is a string, but the record key is '
                      "not valid UTF-8 (byte 2 of 3); send UTF-8 keys or declare the column "
                      "as binary")


def test_kafka_meta_follows_the_contract() -> None:
    meta = kafka_meta("orders", 3, 2**40, TS_MS, b"\x00k\xff", [("trace", b"t-1")])
    assert meta == {"t": "orders", "p": 3, "o": 2**40, "ts": TS_MS,
                    "k": base64.b64encode(b"\x00k\xff").decode(),
                    "hs": '[{"key":"trace","value":"t-1"}]'}
    assert set(meta) == set(KAFKA_META_KEYS.values())
    assert META_KAFKA == "kf"
    empty = kafka_meta("t", 0, 0, 0, None, [])
    assert (empty["k"], empty["hs"]) == (None, "[]")
    assert kafka_meta("t", 0, 0, 0, b"", [])["k"] == ""  # an empty key is not a missing one
    assert kafka_meta("t", 0, 0, -1, None, [])["ts"] is None  # Kafka's "no timestamp"


def test_kafka_headers_keep_order_repeats_nulls_and_bytes_but_never_secrets() -> None:
    headers = [("trace-id", b"abc"), ("Authorization", b"Bearer x"), ("dup", b"1"),
               ("empty", None), ("blob", b"\xff\x00\xfe"), ("X-Session-Id", b"s"),
               ("dup", "é".encode()), ("My-Api-Key", b"k"), ("Zero", b"")]
    decoded = msgspec.json.decode(kafka_meta("t", 0, 0, 0, None, headers)["hs"])
    assert decoded == [
        {"key": "trace-id", "value": "abc"},
        {"key": "dup", "value": "1"},
        {"key": "empty", "value": None},
        {"key": "blob", "value_base64": base64.b64encode(b"\xff\x00\xfe").decode()},
        {"key": "dup", "value": "é"},
        {"key": "Zero", "value": ""},
    ]


# -- the pipeline's half: the decode -------------------------------------------------------


def kf(offset: int, key: bytes | None, headers: list[tuple[str, bytes | None]] | None = None,
       **extra: str) -> bytes:
    meta = {META_KAFKA: kafka_meta("orders", 2, offset, TS_MS + offset, key, headers or []),
            **extra}
    return msgspec.json.encode(meta)


def derived(metas: list[bytes] | pa.Array | None, rows: int,
            stream: StreamConfig = KAFKA) -> list[dict[str, Any]]:
    plan = stream_specs([stream])[0].plan()
    assert isinstance(plan, StreamPlan)
    payload = pa.table({"a": pa.array(range(rows), pa.int64())})
    table = add_derived(payload, plan, [f"e{i}" for i in range(rows)], [0] * rows, metas)
    return table.to_pylist()


def test_kafka_meta_becomes_typed_columns_and_records_without_it_are_null() -> None:
    metas = [kf(7, "ключ".encode(), [("h", b"v")]), b"", kf(8, None, ip="1.2.3.4"),
             b'{"ip":"10.0.0.1"}', kf(9, b"")]
    rows = derived(metas, 5)
    first = rows[0]
    assert (first["key"], first["key_bytes"]) == ("ключ", "ключ".encode())
    assert msgspec.json.decode(first["headers"]) == [{"key": "h", "value": "v"}]
    assert (first["partition"], first["partition_long"], first["offset"], first["topic"]) == (
        2, 2, 7, "orders")
    assert first["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 12000, tzinfo=UTC)
    assert (first["at_ms"], first["day"]) == (TS_MS + 7, dt.date(2023, 11, 14))
    assert (rows[2]["key"], rows[2]["key_bytes"], rows[2]["offset"]) == (None, None, 8)
    assert (rows[4]["key"], rows[4]["key_bytes"], rows[4]["offset"]) == ("", b"", 9)
    for row in (rows[1], rows[3]):  # HTTP/gRPC events: no Kafka record, null columns
        assert {k: v for k, v in row.items() if k != "a"} == dict.fromkeys(row.keys() - {"a"})
    assert derived(None, 2)[1]["topic"] is None  # a batch without any meta
    assert derived(pa.array(metas, pa.binary()), 5) == rows


def test_kafka_keys_decode_in_bulk_like_base64() -> None:
    keys = [bytes(range(n)) * 3 for n in range(40)] + [None, b"\xff" * 1000]
    texts = pa.array([None if k is None else base64.b64encode(k).decode() for k in keys])
    assert b64decode_column(texts, "k").to_pylist() == keys
    assert b64decode_column(texts.slice(5, 20), "k").to_pylist() == keys[5:25]
    assert b64decode_column(pa.array([], pa.string()), "k").to_pylist() == []


def test_a_meta_key_that_is_not_base64_is_null_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    texts = pa.array(["QUJD", "QQ=", "Q=Q=", "not base64!", None, "QQ=="])
    with caplog.at_level(logging.WARNING, "icefloe.pipeline"):
        assert b64decode_column(texts, "k").to_pylist() == [
            b"ABC", None, None, None, None, b"A"]
    assert "column k (from = kafka_key): 3 record key(s)" in caplog.text


def test_a_key_that_is_not_utf8_in_a_string_column_is_null_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """The listener refuses such a key for a string column; one accepted while the column
    was binary still must not fail the run."""
    with caplog.at_level(logging.WARNING, "icefloe.pipeline"):
        rows = derived([kf(1, b"\xff"), kf(2, b"fine")], 2)
    assert [(r["key"], r["key_bytes"]) for r in rows] == [(None, b"\xff"), ("fine", b"fine")]
    assert "column key (from = kafka_key): 1 record key(s) are not UTF-8" in caplog.text


def test_kafka_meta_survives_the_batch_file_and_both_splits() -> None:
    stream = StreamConfig(name="s", table="a.b", columns=(
        Column("a", "long"), Column("key", "binary", source="kafka_key"),
        Column("offset", "long", source="kafka_offset"),
        Column("ip", "string", source="ip")))
    block = (frame_encoded("s", 1, [b"e1"], [b'{"a":1}'], meta=kf(41, b"\x01"))
             + frame_encoded("s", 1, [b"e2"], [b'{"a":2}'], meta=kf(42, None))
             + frame_events("s", 2, ["e3"], [b'{"a":3}'], meta=b'{"ip":"h3"}'))
    builder = BatchBuilder()
    builder.add_framed(block, 3)
    data = builder.finish()
    out = decode_batch_file(data, EntryFile(1, "k", len(data), 0),
                            {"s": stream_specs([stream])[0].plan()})
    rows = out.tables["s"].to_pylist()
    assert [(r["a"], r["key"], r["offset"], r["ip"]) for r in rows] == [
        (1, b"\x01", 41, None), (2, None, 42, None), (3, None, None, "h3")]
