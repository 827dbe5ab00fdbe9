"""Avro streams: columns from a schema, framings, payload checks, fingerprints, and batches of
bodies written under several schema versions decoded into one Arrow table (the vectorised
path and the per-row fallback alike), values compared with what the producer sent."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import struct
import uuid
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from icefloe.typed.avro import AvroSchemaError, AvroType, check, unframe
from icefloe.typed.codec import TypedPayloadError
from pipeline.columns import arrow_type
from pipeline.load import avro_arrow
from pipeline.load.avro_arrow import decode_avro, reader_arrow_schema

UTC = dt.UTC
U1 = uuid.UUID("6f1c2b9e-3d4a-4e5f-8a7b-0c1d2e3f4a5b")
U2 = uuid.UUID("00000000-0000-4000-8000-000000000009")

# (field, Avro type, value sent, column type, value read back)
CASES: list[tuple[str, Any, Any, str, Any]] = [
    ("b", "boolean", True, "boolean", True),
    ("i", "int", -5, "int", -5),
    ("l", "long", 2**40, "long", 2**40),
    ("f", "float", 1.5, "float", 1.5),
    ("d", "double", 2.25, "double", 2.25),
    ("by", "bytes", b"\x00\xff", "binary", b"\x00\xff"),
    ("s", "string", "hé", "string", "hé"),
    ("fx", {"type": "fixed", "name": "F4", "size": 4}, b"abcd", "binary", b"abcd"),
    ("en", {"type": "enum", "name": "E", "symbols": ["A", "B"]}, "B", "string", "B"),
    ("arr", {"type": "array", "items": "int"}, [1, 2], "list<int>", [1, 2]),
    ("rec", {"type": "record", "name": "R", "fields": [
        {"name": "x", "type": "int"}, {"name": "y", "type": ["null", "string"]}]},
     {"x": 1, "y": "z"}, "struct<x: int, y: string>", {"x": 1, "y": "z"}),
    ("decb", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3},
     decimal.Decimal("12.345"), "decimal(10,3)", decimal.Decimal("12.345")),
    ("decf", {"type": "fixed", "name": "DF", "size": 8, "logicalType": "decimal",
              "precision": 18, "scale": 2},
     decimal.Decimal("-1.25"), "decimal(18,2)", decimal.Decimal("-1.25")),
    ("uu", {"type": "string", "logicalType": "uuid"}, U1, "uuid", U1.bytes),
    ("uf", {"type": "fixed", "name": "U16", "size": 16, "logicalType": "uuid"}, U2.bytes,
     "uuid", U2.bytes),
    ("da", {"type": "int", "logicalType": "date"}, dt.date(2026, 1, 2), "date",
     dt.date(2026, 1, 2)),
    ("tm", {"type": "int", "logicalType": "time-millis"}, dt.time(1, 2, 3, 4000), "time",
     dt.time(1, 2, 3, 4000)),
    ("tu", {"type": "long", "logicalType": "time-micros"}, dt.time(1, 2, 3, 4), "time",
     dt.time(1, 2, 3, 4)),
    ("tsm", {"type": "long", "logicalType": "timestamp-millis"},
     dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC), "timestamp",
     dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)),
    ("tsu", {"type": "long", "logicalType": "timestamp-micros"},
     dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "timestamp",
     dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)),
    ("ltm", {"type": "long", "logicalType": "local-timestamp-millis"},
     dt.datetime(2026, 1, 2, 3, 4, 5, 6000), "timestamp_ntz",
     dt.datetime(2026, 1, 2, 3, 4, 5, 6000)),
    ("ltu", {"type": "long", "logicalType": "local-timestamp-micros"},
     dt.datetime(2026, 1, 2, 3, 4, 5, 6), "timestamp_ntz", dt.datetime(2026, 1, 2, 3, 4, 5, 6)),
    ("unknown", {"type": "long", "logicalType": "icefloe-test-unknown"}, 5, "long", 5),
    ("nul1", ["null", "long"], 3, "long", 3),
    ("nul2", ["string", "null"], None, "string", None),
]
MAP_CASE = ("mp", {"type": "map", "values": "long"}, {"a": 1}, "map<string,long>",
            [("a", 1)])


def record(cases: list[tuple[str, Any, Any, str, Any]], name: str = "T") -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "acme",
            "fields": [{"name": n, "type": t} for n, t, *_ in cases]}


def vectorised_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if a batch falls back to the per-row path (proves polars decoded it)."""
    def refused(*args: Any) -> Any:
        raise AssertionError("the batch fell back to the per-row path")
    monkeypatch.setattr(avro_arrow, "_row_group", refused)


def encode(schema: AvroType, value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema.fast, value)
    return out.getvalue()


# -- columns -------------------------------------------------------------------------------


def test_every_avro_type_and_logical_type_has_its_column_type() -> None:
    avro = AvroType(record([*CASES, MAP_CASE]))
    columns = {c.name: c for c in avro.columns()}
    for name, _, _, kind, _ in [*CASES, MAP_CASE]:
        assert columns[name].type == kind, name
    assert [c.name for c in avro.columns()] == [c[0] for c in [*CASES, MAP_CASE]]
    assert columns["nul1"].required is False
    assert columns["nul2"].required is False
    assert columns["b"].required is True
    assert reader_arrow_schema(avro) == pa.schema(
        [pa.field(c.name, arrow_type(c.type)) for c in avro.columns()])
    assert reader_arrow_schema(avro).field("ltu").type == pa.timestamp("us")


def test_docs_and_named_types_of_earlier_schemas() -> None:
    address = AvroType({"type": "record", "name": "Address", "namespace": "acme",
                        "fields": [{"name": "city", "type": "string"}]})
    person = AvroType({"type": "record", "name": "Person", "namespace": "acme", "fields": [
        {"name": "home", "type": "Address", "doc": "where they live"},
        {"name": "work", "type": ["null", "acme.Address"]}]}, named=[address])
    assert [(c.name, c.type, c.required, c.doc) for c in person.columns()] == [
        ("home", "struct<city: string>", True, "where they live"),
        ("work", "struct<city: string>", False, "")]


@pytest.mark.parametrize(("field_type", "words"), [
    (["null", "string", "long"], ["field bad", "string, long", "union"]),
    ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2},
     ["field bad", "precision 40", "38"]),
    ("null", ["field bad", "null"]),
    ({"type": "array", "items": ["int", "string"]}, ["field bad", "int, string"]),
])
def test_unsupported_types_are_refused_naming_the_field(field_type: Any,
                                                        words: list[str]) -> None:
    avro = AvroType({"type": "record", "name": "T",
                     "fields": [{"name": "ok", "type": "int"},
                                {"name": "bad", "type": field_type}]})
    with pytest.raises(AvroSchemaError) as caught:
        avro.columns()
    for word in words:
        assert word in str(caught.value)


def test_recursive_record_refused_naming_the_field() -> None:
    avro = AvroType({"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "long"},
        {"name": "next", "type": ["null", "Node"]}]})
    with pytest.raises(AvroSchemaError, match=r"field next: record Node contains itself"):
        avro.columns()


def test_schemas_that_are_no_table_are_refused() -> None:
    with pytest.raises(AvroSchemaError, match="must be a record"):
        AvroType('"string"')
    with pytest.raises(AvroSchemaError, match="does not parse"):
        AvroType({"type": "record", "name": "T", "fields": [{"name": "a", "type": "nope"}]})


# -- fingerprints and framings -------------------------------------------------------------

# The Avro project's published CRC-64-AVRO vectors (share/test/data/schema-tests.txt),
# signed 64-bit values; single-object encoding carries them little-endian.
VECTORS = [
    ({"type": "record", "name": "foo", "fields": [{"name": "f1", "type": "boolean"}]},
     7843277075252814651),
    ({"type": "record", "name": "PigValue", "fields": [
        {"name": "value", "type": ["null", "int", "long", "PigValue"]}]},
     -1759257747318642341),
]


def test_fingerprint_matches_the_avro_spec_vectors() -> None:
    for schema, expected in VECTORS:
        assert AvroType(schema).fingerprint() == struct.pack("<q", expected)
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    # the same algorithm on the spec's primitive vectors (a record is all AvroType takes)
    for primitive, expected in [("null", 7195948357588979594),
                                ("boolean", -6970731678124411036),
                                ("int", 8247732601305521295),
                                ("long", -3434872931120570953)]:
        text = fingerprint(to_parsing_canonical_form(primitive), "CRC-64-AVRO")
        assert bytes.fromhex(text) == struct.pack("<q", expected)
    # attribute order, docs and whitespace do not change it (Parsing Canonical Form)
    reordered = {"fields": [{"type": "boolean", "name": "f1", "doc": "x"}], "name": "foo",
                 "type": "record", "doc": "y"}
    assert AvroType(reordered).fingerprint() == struct.pack("<q", 7843277075252814651)


def test_confluent_and_single_object_framings() -> None:
    avro = AvroType(record(CASES[:2]))
    body = encode(avro, {"b": True, "i": 7})
    assert unframe(b"\x00" + struct.pack(">I", 42) + body) == ("confluent", 42, body)
    single = b"\xc3\x01" + avro.fingerprint() + body
    assert unframe(single) == ("single", avro.fingerprint(), body)


@pytest.mark.parametrize("payload", [b'{"b": true}', b"\x00\x01", b"\xc3\x01\x02", b""])
def test_other_framings_are_refused_naming_both_and_the_first_bytes(payload: bytes) -> None:
    with pytest.raises(TypedPayloadError) as caught:
        unframe(payload)
    message = str(caught.value)
    assert "Confluent" in message
    assert "single-object" in message
    assert (payload[:3].hex(" ") if payload else "nothing") in message


# -- payload checks ------------------------------------------------------------------------


def test_check_names_the_field_where_a_body_stops() -> None:
    avro = AvroType(record([CASES[2], CASES[6], CASES[23]]))  # long, string, null|long
    body = encode(avro, {"l": 1, "s": "abc", "nul1": 4})
    check(body, avro)
    with pytest.raises(TypedPayloadError) as truncated:
        check(body[:-1], avro)
    assert truncated.value.field == "nul1"
    assert "nul1" in str(truncated.value)
    bad_union = body[:-2] + b"\x08\x02"  # union index 4 of a two-branch union
    with pytest.raises(TypedPayloadError) as union:
        check(bad_union, avro)
    assert union.value.field == "nul1"
    with pytest.raises(TypedPayloadError, match="2 bytes are left"):
        check(body + b"\x00\x00", avro)


# -- decoding into Arrow -------------------------------------------------------------------


@pytest.mark.parametrize("with_map", [False, True], ids=["vectorised", "per-row"])
def test_every_type_round_trips_into_arrow(with_map: bool,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if not with_map:
        vectorised_only(monkeypatch)
    cases = [*CASES, MAP_CASE] if with_map else CASES
    avro = AvroType(record(cases))
    sent = {name: value for name, _, value, _, _ in cases}
    other = {**sent, "nul1": None, "nul2": "x", "l": 7}
    table, bad = decode_avro(avro, [encode(avro, sent), encode(avro, other)], [avro, avro])
    assert bad == []
    assert table.schema == reader_arrow_schema(avro)
    rows = table.to_pylist()
    for name, _, _, _, expected in cases:
        assert rows[0][name] == expected, name
    assert (rows[1]["nul1"], rows[1]["nul2"], rows[1]["l"]) == (None, "x", 7)


V1 = {"type": "record", "name": "Order", "namespace": "acme", "fields": [
    {"name": "id", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "note", "type": "string"}]}
V2 = {"type": "record", "name": "Order", "namespace": "acme", "fields": [
    {"name": "id", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "note", "type": "string"},
    {"name": "channel", "type": "string", "default": "web"},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    {"name": "coupon", "type": ["null", "string"], "default": None}]}
V3 = {"type": "record", "name": "Order", "namespace": "acme", "fields": [
    {"name": "id", "type": "string"},
    {"name": "qty", "type": "long"},
    {"name": "channel", "type": "string", "default": "web"},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    {"name": "coupon", "type": ["null", "string"], "default": None},
    {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"},
     "default": 0}]}


@pytest.mark.parametrize("with_map", [False, True], ids=["vectorised", "per-row"])
def test_records_of_three_versions_land_in_the_latest_schema(
        with_map: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not with_map:
        vectorised_only(monkeypatch)
    extra = {"name": "attrs", "type": {"type": "map", "values": "string"}, "default": {}}
    v1, v2, v3 = (AvroType({**s, "fields": [*s["fields"], extra]} if with_map else s)
                  for s in (V1, V2, V3))
    assert v3.incompatibilities(v1) == []
    assert v3.incompatibilities(v2) == []
    maps = {"attrs": {"k": "v"}} if with_map else {}
    bodies = [encode(v1, {"id": "a", "qty": 1, "note": "n", **maps}),
              encode(v3, {"id": "b", "qty": 2**40, "channel": "app", "tags": ["x"],
                          "coupon": "C", "placed": dt.datetime(2026, 1, 1, tzinfo=UTC),
                          **maps}),
              encode(v2, {"id": "c", "qty": 3, "note": "n", "channel": "shop",
                          "tags": ["y", "z"], "coupon": None, **maps}),
              encode(v1, {"id": "d", "qty": -4, "note": "n", **maps})]
    table, bad = decode_avro(v3, bodies, [v1, v3, v2, v1])
    assert bad == []
    assert table.schema == reader_arrow_schema(v3)
    assert table.schema.field("qty").type == pa.int64()
    default_time = dt.datetime(1970, 1, 1, tzinfo=UTC)
    rows = [{k: v for k, v in row.items() if k != "attrs"} for row in table.to_pylist()]
    assert rows == [
        {"id": "a", "qty": 1, "channel": "web", "tags": [], "coupon": None,
         "placed": default_time},
        {"id": "b", "qty": 2**40, "channel": "app", "tags": ["x"], "coupon": "C",
         "placed": dt.datetime(2026, 1, 1, tzinfo=UTC)},
        {"id": "c", "qty": 3, "channel": "shop", "tags": ["y", "z"], "coupon": None,
         "placed": default_time},
        {"id": "d", "qty": -4, "channel": "web", "tags": [], "coupon": None,
         "placed": default_time},
    ]
    if with_map:
        assert table.column("attrs").to_pylist() == [[("k", "v")]] * 4


def test_an_incompatible_change_is_listed_naming_the_field() -> None:
    v1 = AvroType(V1)
    narrowed = AvroType({**V1, "fields": [{"name": "id", "type": "string"},
                                          {"name": "qty", "type": "string"},
                                          {"name": "note", "type": "string"},
                                          {"name": "added", "type": "long"}]})
    problems = narrowed.incompatibilities(v1)
    assert problems, problems
    text = " ".join(problems)
    assert "field qty" in text
    assert "field added" in text


def test_string_and_bytes_promote_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    vectorised_only(monkeypatch)
    writer = AvroType({"type": "record", "name": "P", "fields": [
        {"name": "a", "type": "string"}, {"name": "b", "type": "bytes"},
        {"name": "c", "type": "int"}, {"name": "d", "type": "float"}]})
    reader = AvroType({"type": "record", "name": "P", "fields": [
        {"name": "a", "type": "bytes"}, {"name": "b", "type": "string"},
        {"name": "c", "type": "double"}, {"name": "d", "type": "double"}]})
    assert reader.incompatibilities(writer) == []
    body = encode(writer, {"a": "hé", "b": b"ok", "c": 3, "d": 0.5})
    table, bad = decode_avro(reader, [body], [writer])
    assert bad == []
    assert table.to_pylist() == [{"a": "hé".encode(), "b": "ok", "c": 3.0, "d": 0.5}]


@pytest.mark.parametrize("with_map", [False, True], ids=["vectorised", "per-row"])
def test_a_corrupt_body_is_reported_and_the_others_kept(with_map: bool) -> None:
    cases = [CASES[2], CASES[6], CASES[23], *([MAP_CASE] if with_map else [])]
    avro = AvroType(record(cases))
    extra = {"mp": {"a": 1}} if with_map else {}
    bodies = [encode(avro, {"l": i, "s": f"s{i}", "nul1": i, **extra}) for i in range(5)]
    bodies[2] = bodies[2][:-1]
    table, bad = decode_avro(avro, bodies, [avro] * 5)
    assert [i for i, _ in bad] == [2]
    assert ("mp" if with_map else "nul1") in bad[0][1]
    assert table.column("l").to_pylist() == [0, 1, 3, 4]
    assert table.column("s").to_pylist() == ["s0", "s1", "s3", "s4"]


def test_many_bodies_span_several_container_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    vectorised_only(monkeypatch)
    avro = AvroType(record([CASES[2], CASES[13]]))  # long, uuid
    count = avro_arrow.BLOCK * 2 + 7
    ids = [uuid.UUID(int=i) for i in range(count)]
    bodies = [encode(avro, {"l": i, "uu": ids[i]}) for i in range(count)]
    table, bad = decode_avro(avro, bodies, [avro] * count)
    assert bad == []
    assert table.column("l").to_pylist() == list(range(count))
    assert table.column("uu").to_pylist() == [u.bytes for u in ids]


def test_no_bodies_is_an_empty_table() -> None:
    avro = AvroType(record(CASES[:3]))
    table, bad = decode_avro(avro, [], [])
    assert (table.num_rows, bad, table.schema) == (0, [], reader_arrow_schema(avro))


@pytest.mark.parametrize("with_map", [False, True], ids=["vectorised", "per-row"])
def test_nested_records_resolve_at_every_depth(with_map: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A nested record gains a field with a default, an int becomes a long inside a list of
    records, and an optional record is null in one row: all resolved in place."""
    if not with_map:
        vectorised_only(monkeypatch)
    extra = [{"name": "m", "type": {"type": "map", "values": "int"}, "default": {}}] \
        if with_map else []

    def version(item_fields: list[Any], qty: str) -> AvroType:
        item = {"type": "record", "name": "Item", "fields": [
            {"name": "sku", "type": "string"}, {"name": "qty", "type": qty}, *item_fields]}
        return AvroType({"type": "record", "name": "Cart", "namespace": "acme", "fields": [
            {"name": "items", "type": {"type": "array", "items": item}},
            {"name": "gift", "type": ["null", "Item"], "default": None}, *extra]})

    old = version([], "int")
    new = version([{"name": "kind", "type": {"type": "enum", "name": "K",
                                             "symbols": ["STD", "GIFT"]}, "default": "STD"},
                   {"name": "uid", "type": {"type": "string", "logicalType": "uuid"},
                    "default": str(U2)}], "long")
    assert new.incompatibilities(old) == []
    maps = {"m": {"a": 1}} if with_map else {}
    bodies = [encode(old, {"items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}],
                           "gift": None, **maps}),
              encode(new, {"items": [], "gift": {"sku": "g", "qty": 2**40, "kind": "GIFT",
                                                 "uid": U1}, **maps}),
              encode(old, {"items": [{"sku": "c", "qty": 3}], "gift": {"sku": "h", "qty": 4},
                           **maps})]
    table, bad = decode_avro(new, bodies, [old, new, old])
    assert bad == []
    assert table.schema.field("items").type == arrow_type(
        "list<struct<sku: string, qty: long, kind: string, uid: uuid>>")
    std = {"kind": "STD", "uid": U2.bytes}
    assert table.column("items").to_pylist() == [
        [{"sku": "a", "qty": 1, **std}, {"sku": "b", "qty": 2, **std}], [],
        [{"sku": "c", "qty": 3, **std}]]
    assert table.column("gift").to_pylist() == [
        None, {"sku": "g", "qty": 2**40, "kind": "GIFT", "uid": U1.bytes},
        {"sku": "h", "qty": 4, **std}]


ENUM = {"type": "enum", "name": "K", "symbols": ["A", "B"]}
SHAPES: dict[str, tuple[Any, list[Any]]] = {
    "enum": (ENUM, ["B", "A"]),
    "optional enum": (["null", ENUM], ["B", None]),
    "array of enums": ({"type": "array", "items": ENUM}, [["A", "B"], []]),
    "record with an enum": ({"type": "record", "name": "R", "fields": [
        {"name": "k", "type": ENUM}]}, [{"k": "B"}, {"k": "A"}]),
    "optional record": (["null", {"type": "record", "name": "R", "fields": [
        {"name": "k", "type": ["null", "int"]}]}], [{"k": 1}, None]),
    "array of records": ({"type": "array", "items": {"type": "record", "name": "R",
                                                     "fields": [{"name": "k", "type": "int"}]}},
                         [[{"k": 1}], []]),
    "record with a uuid": ({"type": "record", "name": "R", "fields": [
        {"name": "k", "type": {"type": "string", "logicalType": "uuid"}}]},
        [{"k": U1}, {"k": U2}]),
    "array of optional longs": ({"type": "array", "items": ["null", "long"]},
                                [[1, None], [2]]),
    "array of timestamps": ({"type": "array", "items": {"type": "long",
                                                        "logicalType": "timestamp-millis"}},
                            [[dt.datetime(2026, 1, 1, tzinfo=UTC)], []]),
    "array of arrays": ({"type": "array", "items": {"type": "array", "items": "int"}},
                        [[[1], [2, 3]], [[]]]),
    "optional array": (["null", {"type": "array", "items": "int"}], [[1], None]),
    "array of decimals": ({"type": "array", "items": {"type": "bytes", "logicalType": "decimal",
                                                      "precision": 5, "scale": 1}},
                          [[decimal.Decimal("1.5")], [decimal.Decimal("-2.0")]]),
    "array of local times": ({"type": "array", "items": {
        "type": "long", "logicalType": "local-timestamp-micros"}},
        [[dt.datetime(2026, 1, 1, 1, 2, 3, 4)], []]),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_vectorised_and_per_row_paths_agree(shape: str) -> None:
    kind, values = SHAPES[shape]
    avro = AvroType({"type": "record", "name": "T", "fields": [
        {"name": "f", "type": kind}, {"name": "n", "type": "long"}]})
    bodies = [encode(avro, {"f": v, "n": i}) for i, v in enumerate(values)]
    schema = reader_arrow_schema(avro)
    vectorised = avro_arrow._vectorised_group(avro, avro, bodies, schema)
    per_row, bad = avro_arrow._row_group(avro, avro, bodies, schema)
    assert bad == []
    assert vectorised.equals(per_row), (vectorised.to_pylist(), per_row.to_pylist())
    assert vectorised.column("n").to_pylist() == list(range(len(values)))


def test_the_method_forms_the_ingestor_calls() -> None:
    """``AvroType.from_schema`` and ``kind.check(body, writer)``, as ``ingestor/typed.py``
    and ``icefloe/typed/kinds.py`` call them."""
    avro = AvroType.from_schema(json.dumps(V1))
    body = encode(avro, {"id": "a", "qty": 1, "note": "n"})
    avro.check(body, avro)
    avro.check(body)
    with pytest.raises(TypedPayloadError, match="at field note"):
        avro.check(body[:-1], avro)


def test_a_batchs_bodies_as_one_arrow_array_decode_on_the_vectorised_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector hands a batch's bodies as the Arrow array its columnar split made
    (several writer schemas by id, more than a container block, a sliced array): polars
    decodes them without the per-row fallback, equal to the list path, in input order."""
    import numpy as np

    from pipeline.load.avro_arrow import decode_avro_by_id

    v1 = AvroType(record([c for c in CASES if c[0] in ("i", "s")]))
    v2 = AvroType(record([c for c in CASES if c[0] in ("i", "s", "nul1")]))
    reader = v2
    values = [{"i": n, "s": f"s{n}"} if n % 3 else {"i": n, "s": f"s{n}", "nul1": n}
              for n in range(2500)]
    writers = [v1 if n % 3 else v2 for n in range(2500)]
    bodies = [encode(w, v) for w, v in zip(writers, values, strict=True)]
    expected, _ = decode_avro(reader, bodies, writers)
    vectorised_only(monkeypatch)
    array = pa.array([b"pad", *bodies], pa.binary()).slice(1)
    ids = np.array([1 if w is v1 else 2 for w in writers], dtype=np.int64)
    table, bad = decode_avro_by_id(reader, array, ids, {1: v1, 2: v2})
    assert bad == []
    assert table.equals(expected)
    assert table.column("i").to_pylist() == list(range(2500))


@pytest.mark.parametrize("where", ["top", "nested", "aliased"])
def test_a_symbol_the_readers_enum_lacks_is_kept_as_written_on_both_paths(where: str) -> None:
    """A newer writer's enum symbol (``PURPLE``) that the reader's enum lacks, though the
    reader's has a ``default``: kept as the writer wrote it on the columnar path and on the
    per-row path (which a writer schema with a map takes); fastavro alone gave the
    default there, so the same symbol landed as two values."""
    def enum(symbols: list[str], **more: Any) -> dict[str, Any]:
        return {"type": "enum", "name": "Colour", "symbols": symbols, **more}

    def schema(colour: dict[str, Any]) -> dict[str, Any]:
        field = {"name": "c", "type": colour} if where != "nested" else {
            "name": "c", "type": {"type": "record", "name": "Inner", "fields": [
                {"name": "v", "type": colour}]}}
        return {"type": "record", "name": "T", "namespace": "acme", "fields": [
            field, {"name": "n", "type": "long"}]}

    writer = AvroType(schema(enum(["RED", "PURPLE"])))
    reader_enum = enum(["RED"], default="RED")
    if where == "aliased":
        reader_enum = {**reader_enum, "name": "Color", "aliases": ["Colour"]}
    reader = AvroType(schema(reader_enum))
    value = {"v": "PURPLE"} if where == "nested" else "PURPLE"
    bodies = [encode(writer, {"c": value, "n": 1})]
    arrow = reader_arrow_schema(reader)
    vectorised = avro_arrow._vectorised_group(reader, writer, bodies, arrow)
    per_row, bad = avro_arrow._row_group(reader, writer, bodies, arrow)
    assert bad == []
    assert per_row.to_pylist() == vectorised.to_pylist() == [{"c": value, "n": 1}]
