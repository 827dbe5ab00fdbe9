"""A ``format = "protobuf"`` stream the whole way (#39): a producer's own message over gRPC
(its bytes in ``Event.data``, sent by the generated class through icefloe's client) and
over HTTP (``application/x-protobuf``, length-delimited, canonical JSON) → the ingestor
checks each message → envelope version 2 in the batch files → the collector decodes into
Arrow → Iceberg; read back by pyiceberg, ``icefloe query`` and Spark, also after the
``.proto`` renamed fields (same numbers: same columns) and added one. Bad messages are
refused with the field named and nothing of the request stored."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import msgspec
import pytest
from collector_support import collect_all, collector_config, output_engine, read_table
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from ingest_support import grpc_serving, http_serving, running, stored_events

from icefloe.client import AsyncGrpcClient, IngestRejected
from icefloe.config import Config, StreamConfig
from icefloe.config.typed_streams import with_typed_columns
from icefloe.streams.model import TypedSchema
from icefloe.v1 import ingest_pb2
from icefloe_app.cli import main
from pipeline.load.run import LocalEngine

UTC = dt.UTC
MESSAGE = "acme.orders.v1.OrderPlaced"
PROTO_V1 = """
syntax = "proto3";
package acme.orders.v1;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

enum Status { STATUS_UNSPECIFIED = 0; STATUS_PLACED = 1; STATUS_PAID = 2; }
message Item { string sku = 1; int32 quantity = 2; double price = 3; }
message OrderPlaced {
  string order_id = 1;
  int64 amount_cents = 2;
  Status status = 3;
  repeated Item items = 4;
  map<string, string> labels = 5;
  google.protobuf.Timestamp placed_at = 6;
  google.protobuf.StringValue coupon = 7;
  Item first = 8;
}
"""
PROTO_V2 = (PROTO_V1
            .replace("string sku = 1;", "string code = 1;")
            .replace("int64 amount_cents = 2;", "int64 total_cents = 2;")
            .replace("Item first = 8;", "Item first = 8;\n  string channel = 9;"))
"""A field renamed at the top level and one inside a nested message (numbers kept), and a
field added: the table keeps its columns under the new names and gains one."""


def compile_proto(root: Path, text: str) -> Path:
    """``protoc --include_imports --descriptor_set_out`` of ``text``; the set's path."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "orders.proto").write_text(text)
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    out = root / "orders.binpb"
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"-I{include}",
         "--include_imports", f"--descriptor_set_out={out}", f"--python_out={root}",
         "orders.proto"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out


def generated_module(root: Path) -> ModuleType:
    """The ``orders_pb2`` protoc generated (a producer's own class)."""
    spec = importlib.util.spec_from_file_location("typed_orders_v1_pb2", root / "orders_pb2.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.asynccontextmanager
async def grpc_client(config: Config, **options: Any) -> AsyncIterator[AsyncGrpcClient]:
    """icefloe's gRPC client on a real ingestor serving ``config``."""
    async with grpc_serving(config) as (_, served), \
            AsyncGrpcClient(f"127.0.0.1:{served.port}", **options) as client:
        yield client


def message_class(descriptor_set: Path, name: str = MESSAGE) -> Any:
    """A message class from a descriptor set, in its own pool (a second version of the
    same file cannot share the default pool with the first)."""
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def typed_config(tmp_path: Path, descriptor_set: Path, id_field: str | None = None,
                 **collector: Any) -> Config:
    stream = StreamConfig(name="orders", table="shop.orders", columns=(), format="protobuf",
                          schema=TypedSchema(message=MESSAGE,
                                             descriptor_set=str(descriptor_set)),
                          event_id_field=id_field)
    streams = with_typed_columns((stream,), tmp_path, "test")
    return collector_config(tmp_path, streams=streams, **collector)


def order(cls: Any, i: int, **fields: Any) -> Any:
    msg = cls(order_id=f"o{i}", status=1 + i % 2, labels={"src": f"s{i}"}, **fields)
    msg.items.add(quantity=i, price=1.5 * i, **{_sku(cls): f"sku{i}"})
    msg.placed_at.FromDatetime(dt.datetime(2026, 11, 23, 10, i, tzinfo=UTC))
    if i % 2:
        msg.coupon.value = f"C{i}"
    msg.first.CopyFrom(msg.items[0])
    amount = "total_cents" if _v2(cls) else "amount_cents"
    setattr(msg, amount, 100 * i)
    return msg


def _v2(cls: Any) -> bool:
    return "channel" in cls.DESCRIPTOR.fields_by_name


def _sku(cls: Any) -> str:
    return "code" if _v2(cls) else "sku"


async def ingest_v1(config: Config, module: ModuleType) -> None:
    cls = module.OrderPlaced
    async with grpc_client(config) as client:
        assert await client.publish("orders", [order(cls, 1), order(cls, 2)]) == 2
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as http:
        one = await http.post("/v1/streams/orders/events", content=order(cls, 3)
                              .SerializeToString(),
                              headers={"content-type": "application/x-protobuf"})
        assert one.status_code == 202, one.text
        delimited = b"".join(_varint(len(m)) + m for m in (
            order(cls, 4).SerializeToString(), order(cls, 5).SerializeToString()))
        many = await http.post("/v1/streams/orders/events", content=delimited,
                               headers={"content-type": "application/x-protobuf; "
                                                        "delimited=true"})
        assert (many.status_code, many.json()["accepted"]) == (202, 2), many.text
        from google.protobuf import json_format

        canonical = await http.post("/v1/streams/orders/events",
                                    content=json_format.MessageToJson(order(cls, 6)))
        assert canonical.status_code == 202, canonical.text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def check_row(row: dict[str, Any], i: int, *, amount: str = "amount_cents",
              sku: str = "sku") -> None:
    assert row[amount] == 100 * i
    assert row["status"] == ("STATUS_PAID" if i % 2 else "STATUS_PLACED")
    [item] = row["items"]
    assert (item[sku], item["quantity"], item["price"]) == (f"sku{i}", i, 1.5 * i)
    assert dict(row["labels"]) == {"src": f"s{i}"}
    placed = row["placed_at"]  # Spark gives naive datetimes in its session zone (UTC)
    assert (placed if placed.tzinfo else placed.replace(tzinfo=UTC)) == \
        dt.datetime(2026, 11, 23, 10, i, tzinfo=UTC)
    assert row["coupon"] == (f"C{i}" if i % 2 else None)
    assert row["first"][sku] == f"sku{i}"


async def test_a_protobuf_producer_fills_a_table_over_grpc_and_http(tmp_path):
    """Six messages sent four ways land as six rows whose columns are the message's; the
    batch files hold the producer's bytes (envelope version 2), not JSON."""
    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    config = typed_config(tmp_path, v1)
    await ingest_v1(config, generated_module(tmp_path / "v1"))
    stored = await stored_events(config.store.url)
    assert {e.format for e in stored} == {1}
    cls = message_class(v1)
    assert cls.FromString(stored[0].payload).order_id == "o1"
    await collect_all(config, LocalEngine())
    from pipeline.iceberg.catalog import open_catalog

    schema = open_catalog(config.catalog).load_table("shop.orders").schema()
    kinds = {f.name: str(f.field_type) for f in schema.fields}
    assert kinds["amount_cents"] == "long"
    assert kinds["status"] == "string"
    assert kinds["placed_at"] == "timestamptz"
    assert kinds["items"].startswith("list<struct<")
    assert kinds["labels"].startswith("map<string, string>")
    rows = {r["order_id"]: r for r in read_table(config, "shop.orders").to_pylist()}
    assert sorted(rows) == [f"o{i}" for i in range(1, 7)]
    for i in range(1, 7):
        check_row(rows[f"o{i}"], i)


async def test_the_query_command_reads_the_typed_columns(tmp_path, capsys):
    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    config = typed_config(tmp_path, v1)
    cls = message_class(v1)
    async with grpc_client(config) as client:
        assert await client.publish("orders", [order(cls, 3)]) == 1
    await collect_all(config, LocalEngine())
    path = tmp_path / "query.toml"
    path.write_text(f'[catalog]\nuri = "{config.catalog.uri}"\n'
                    f'warehouse = "{config.catalog.warehouse}"\n'
                    '[store]\nurl = "file:///tmp/unused-store"\n')
    capsys.readouterr()
    assert main(["query", "--config", str(path), "--format", "json",
                 "SELECT order_id, amount_cents, status, coupon FROM shop.orders"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"order_id": "o3", "amount_cents": 300, "status": "STATUS_PAID", "coupon": "C3"}]


async def test_renamed_and_added_fields_keep_their_columns_on_spark(tmp_path, spark):
    """v1's rows, then the ``.proto`` renames ``amount_cents`` → ``total_cents`` and
    ``Item.sku`` → ``Item.code`` (numbers kept) and adds ``channel``: the table renames
    the columns (same Iceberg field ids), so old and new rows read under the new names,
    through Spark too; ``channel`` is null on the old rows."""
    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    config = typed_config(tmp_path, v1)
    cls1 = message_class(v1)
    async with grpc_client(config) as client:
        assert await client.publish("orders", [order(cls1, 1)]) == 1
    await collect_all(config, output_engine(spark, "embedded"))
    v2 = compile_proto(tmp_path / "v2", PROTO_V2)
    config2 = typed_config(tmp_path, v2)
    cls2 = message_class(v2)
    async with grpc_client(config2) as client:
        assert await client.publish("orders", [order(cls2, 2, channel="web")]) == 1
    await collect_all(config2, output_engine(spark, "embedded"))
    from pipeline.iceberg.catalog import open_catalog

    table = open_catalog(config.catalog).load_table("shop.orders")
    names = [f.name for f in table.schema().fields]
    assert "amount_cents" not in names
    assert "total_cents" in names
    assert "channel" in names
    from pipeline.read.iceberg_source import read_table as spark_read_table

    frame = spark_read_table(spark, config.catalog, "shop.orders")
    rows = {r["order_id"]: r.asDict(recursive=True) for r in frame.collect()}
    assert sorted(rows) == ["o1", "o2"]
    check_row(rows["o1"], 1, amount="total_cents", sku="code")
    check_row(rows["o2"], 2, amount="total_cents", sku="code")
    assert (rows["o1"]["channel"], rows["o2"]["channel"]) == (None, "web")


async def test_a_message_that_does_not_parse_is_refused_and_nothing_is_stored(tmp_path):
    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    config = typed_config(tmp_path, v1)
    cls = message_class(v1)
    good = order(cls, 1).SerializeToString()
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as http:
        bad = await http.post("/v1/streams/orders/events", content=good[:-3],
                              headers={"content-type": "application/x-protobuf"})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"] == "invalid_payload"
        framed = await http.post("/v1/streams/orders/events", content=b"\x00\x00\x00\x00\x05"
                                 + good, headers={"content-type": "application/x-protobuf"})
        assert framed.status_code == 400
        assert "Confluent" in framed.json()["message"]
        cut = await http.post("/v1/streams/orders/events", content=_varint(50) + good,
                              headers={"content-type": "application/x-protobuf; "
                                                       "delimited=true"})
        assert cut.status_code == 400
        assert "runs past the end" in cut.json()["message"]
        wrong_json = await http.post("/v1/streams/orders/events",
                                     json={"order_id": "o1", "amount_cents": "lots"})
        assert wrong_json.status_code == 400
        assert "amount_cents" in wrong_json.text
    async with grpc_client(config, retries=0) as client:
        with pytest.raises(IngestRejected) as caught:
            await client.publish("orders", [ingest_pb2.Event(data=good),
                                            ingest_pb2.Event(data=b"\xff\xff")])
        assert caught.value.status == grpc.StatusCode.INVALID_ARGUMENT
        assert "event 1" in str(caught.value)
        for events, needle in [
                ([ingest_pb2.Event(data=good), ingest_pb2.Event(data=good, json=b"{}")],
                 "event 1 sets both json and data"),
                ([ingest_pb2.Event(data=good), ingest_pb2.Event(json=b'{"order_id":"x"}')],
                 "mixes events with data and with json")]:
            with pytest.raises(IngestRejected) as mixed:
                await client.publish("orders", events)
            assert needle in str(mixed.value)
    assert await stored_events(config.store.url) == []


async def test_a_json_stream_refuses_binary_messages_by_name(tmp_path):
    config = collector_config(tmp_path)
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as http:
        refused = await http.post("/v1/streams/clicks/events", content=b"\x0a\x01x",
                                  headers={"content-type": "application/x-protobuf"})
        assert refused.status_code == 415
        assert 'format = "protobuf"' in refused.json()["message"]
    async with grpc_client(config, retries=0) as client:
        with pytest.raises(IngestRejected) as caught:
            await client.publish("clicks", [ingest_pb2.Event(data=b"\x0a\x01x")])
        assert "Event.data" in str(caught.value)


def test_a_typed_stream_config_refuses_what_it_cannot_honour(tmp_path):
    from icefloe.config import load_config
    from icefloe.errors import ConfigError

    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    base = f'''[[streams]]
name = "orders"
table = "shop.orders"
format = "protobuf"
schema = {{ message = "{MESSAGE}", descriptor_set = "{v1}" }}
'''
    path = tmp_path / "icefloe.toml"
    for extra, needle in [
            ('columns = [{ name = "x", type = "string" }]\n', "remove `columns`"),
            ('unknown_fields = "evolve"\n', "`unknown_fields` is not available"),
            ('event_id_field = "nope"\n', "event_id_field 'nope' is not a top-level field"),
            ('event_id_field = "items"\n', "event_id_field 'items' is list<"),
            ('on_invalid = "dead_letter"\n', "`on_invalid` is not available")]:
        path.write_text(base + extra)
        with pytest.raises(ConfigError, match=needle):
            load_config(path)
    path.write_text(base.replace(MESSAGE, "acme.orders.v1.Nope"))
    with pytest.raises(ConfigError, match="Nope"):
        load_config(path)
    path.write_text(base.replace(str(v1), str(tmp_path / "missing.binpb")))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)
    path.write_text(base)
    loaded = load_config(path).streams[0]
    assert [c.name for c in loaded.columns][:3] == ["order_id", "amount_cents", "status"]
    assert msgspec.json.decode(msgspec.json.encode(loaded.schema))["text"]


async def test_a_queue_written_during_a_rolling_upgrade_lands_whole(tmp_path):
    """The queue holds a batch an old ingestor wrote (version 1 records only) and batches
    of upgraded ingestors mixing version 1 (a JSON stream) and version 2 (a Protobuf
    stream) records: the (upgraded) collector commits every event of both streams once,
    with no dead letter."""
    from collector_support import CLICKS, click, publish_sync

    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    orders = typed_config(tmp_path, v1).streams[0]
    config = collector_config(tmp_path, streams=(CLICKS, orders))
    publish_sync(config, [[click(i, "old") for i in range(3)]])  # before the upgrade
    cls = message_class(v1)
    async with grpc_client(config) as client:
        assert await client.publish("orders", [order(cls, 1), order(cls, 2)]) == 2
        assert await client.publish("clicks", [{"user_id": "u9", "url": "/new"}]) == 1
    stored = await stored_events(config.store.url)
    assert sorted({(e.stream, e.format) for e in stored}) == [("clicks", 0), ("orders", 1)]
    await collect_all(config, LocalEngine())
    assert sorted(r["order_id"] for r in read_table(config, "shop.orders").to_pylist()) == [
        "o1", "o2"]
    assert sorted(r["user_id"] for r in read_table(config, "web.clicks").to_pylist()) == [
        "u0", "u1", "u2", "u9"]
    from pipeline.iceberg.catalog import open_catalog

    catalog = open_catalog(config.catalog)
    if catalog.table_exists("icefloe.dead_letters"):
        assert read_table(config, "icefloe.dead_letters").num_rows == 0


async def test_a_field_number_reused_with_another_type_parks_the_table_unchanged(tmp_path):
    """Protobuf's rule broken (field 2, a long, comes back as a string named ``note``):
    the collector refuses it before renaming anything, naming the field, its number and
    both types; only that table parks, and its columns stay as they were."""
    from collector_support import start

    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    config = typed_config(tmp_path, v1)
    async with grpc_client(config) as client:
        assert await client.publish("orders", [order(message_class(v1), 1)]) == 1
    await collect_all(config, LocalEngine())
    reused = compile_proto(tmp_path / "v3", PROTO_V1.replace("int64 amount_cents = 2;",
                                                             "string note = 2;"))
    collector = await start(typed_config(tmp_path, reused), LocalEngine())
    try:
        parked = collector.bulkheads.parked["shop.orders"]
        assert "Protobuf field note (number path 2, column amount_cents) is long" \
            in parked.reason, parked.reason
        assert "string" in parked.reason
    finally:
        await collector.store.close()
    from pipeline.iceberg.catalog import open_catalog

    kinds = {f.name: str(f.field_type) for f in
             open_catalog(config.catalog).load_table("shop.orders").schema().fields}
    assert kinds["amount_cents"] == "long"
    assert "note" not in kinds


@pytest.mark.parametrize(("old", "new"), [
    ("int64 amount_cents = 2;", "sint64 amount_cents = 2;"),   # same long column, zigzag
    ("int32 quantity = 2;", "sint32 quantity = 2;"),           # nested, in a list's struct
])
async def test_a_field_whose_encoding_changed_parks_the_table_before_old_payloads_misread(
        tmp_path, old, new):
    """``int64`` → ``sint64`` keeps the column a ``long``, so the column types alone do not
    show it; queued and old producers' payloads would be read as other numbers (5 as -3).
    The table remembers each field's .proto type and the collector refuses the change,
    naming the field and both types; the table keeps its rows and its recorded types."""
    from collector_support import start

    from pipeline.iceberg.catalog import open_catalog
    from pipeline.iceberg.field_numbers import TYPES_PROP

    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    config = typed_config(tmp_path, v1)
    async with grpc_client(config) as client:
        assert await client.publish("orders", [order(message_class(v1), 1)]) == 1
    await collect_all(config, LocalEngine())
    recorded = open_catalog(config.catalog).load_table("shop.orders").properties[TYPES_PROP]
    changed = compile_proto(tmp_path / "v2", PROTO_V1.replace(old, new))
    collector = await start(typed_config(tmp_path, changed), LocalEngine())
    try:
        parked = collector.bulkheads.parked["shop.orders"]
        assert f"was {old.split()[0]} and is {new.split()[0]}" in parked.reason, parked.reason
        assert "not wire-compatible" in parked.reason
    finally:
        await collector.store.close()
    table = open_catalog(config.catalog).load_table("shop.orders")
    assert table.properties[TYPES_PROP] == recorded
    assert len(read_table(config, "shop.orders")) == 1


async def test_an_event_id_field_of_the_message_deduplicates_resent_orders(tmp_path):
    """``event_id_field = "order_id"``: a producer that sends the same order again (in a new
    request, with no idempotency key) gets one row; an order without an id (proto3's empty
    string) gets a generated one."""
    v1 = compile_proto(tmp_path / "v1", PROTO_V1)
    config = typed_config(tmp_path, v1, id_field="order_id", dedup_window_s=300)
    cls = message_class(v1)
    nameless = order(cls, 3)
    nameless.order_id = ""
    async with grpc_client(config) as client:
        assert await client.publish("orders", [order(cls, 1), order(cls, 2)]) == 2
        assert await client.publish("orders", [order(cls, 1), nameless]) == 2
    stored = await stored_events(config.store.url)
    assert [e.event_id for e in stored][:3] == ["o1", "o2", "o1"]
    assert stored[3].event_id not in ("", "o3")
    await collect_all(config, LocalEngine())
    rows = read_table(config, "shop.orders").to_pylist()
    assert sorted(r["order_id"] for r in rows) == ["", "o1", "o2"]


ID_FIELDS = """syntax = "proto3";
package acme.ids.v1;
import "google/protobuf/wrappers.proto";
enum Kind { KIND_UNSPECIFIED = 0; KIND_A = 1; }
message Keyed {
  google.protobuf.StringValue wrapped = 1;
  int64 plain = 2;
  optional int64 present = 3;
  Kind kind = 4;
  string text = 5;
}
"""


def test_event_id_fields_read_wrappers_defaults_and_enums_as_their_columns_do(tmp_path):
    """A wrapper type gives its value (not the text of the wrapper message); a proto3
    scalar without presence holding its default is unset (every such event would share the
    id "0"), one with presence set to 0 is "0"; an enum gives its value's name."""
    from icefloe.typed.protobuf import ProtobufType

    descriptor_set = compile_proto(tmp_path, ID_FIELDS)
    kind = ProtobufType.from_descriptor_set(descriptor_set.read_bytes(), "acme.ids.v1.Keyed")
    cls = message_class(descriptor_set, "acme.ids.v1.Keyed")
    set_ = cls(plain=7, present=0, kind=1, text="t-1")
    set_.wrapped.value = "o-1"
    unset = cls()
    payloads = [set_.SerializeToString(), unset.SerializeToString()]
    texts = {name: kind.field_texts(payloads, name)
             for name in ("wrapped", "plain", "present", "kind", "text")}
    assert texts == {"wrapped": ["o-1", None], "plain": ["7", None], "present": ["0", None],
                     "kind": ["KIND_A", None], "text": ["t-1", None]}


CLOSED_ENUM = """syntax = "proto2";
package acme.closed.v1;
enum C { A = 1; B = 2; }
message M { optional C c = 1; repeated C cs = 2; optional string s = 3; }
"""


def test_a_closed_enums_unknown_value_is_refused_naming_the_enum(tmp_path):
    """proto2 drops a closed enum's value it lacks into the unknown fields (it cannot be
    stored); the refusal says so, naming the field and the enum, not a wire-type error."""
    from icefloe.typed.codec import TypedPayloadError
    from icefloe.typed.protobuf import ProtobufType

    descriptor_set = compile_proto(tmp_path, CLOSED_ENUM)
    kind = ProtobufType.from_descriptor_set(descriptor_set.read_bytes(), "acme.closed.v1.M")
    kind.check(b"\x08\x02")  # B: a value of the enum
    for payload, field in ((b"\x08\x07", "c"), (b"\x10\x01\x10\x09", "cs")):
        with pytest.raises(TypedPayloadError, match=rf"field {field} holds 7|field {field} "
                                                    r"holds 9") as refused:
            kind.check(payload)
        assert "closed (proto2) enum acme.closed.v1.C" in str(refused.value)
    with pytest.raises(TypedPayloadError, match="encoded as varint, but the payload has a "
                                                "32-bit value"):
        kind.check(b"\x1a\x01x" + b"\x0d\x01\x00\x00\x00")  # field 1 as fixed32
