"""Protobuf messages as stream types (issue #39 item 1): descriptor sets written by the real
protoc (grpcio-tools) and buf, messages encoded by classes built from those descriptors
(independently of the code under test), decoded into Arrow by
``pipeline.load.protobuf_arrow`` and compared value by value; the evolution checks on
renamed and retyped fields at every depth; the refusals, each naming what is wrong."""

from __future__ import annotations

import datetime as dt
import json
import pickle
import shutil
import subprocess
import sys
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, message_factory

from icefloe.schemas import formats
from icefloe.streams.typespec import parse_type
from icefloe.typed.codec import TypeChangeError, TypedPayloadError
from icefloe.typed.protobuf import DescriptorError, ProtobufType, message_names
from pipeline.columns import arrow_type
from pipeline.load.protobuf_arrow import decode_protobuf, protobuf_schema

WELL_KNOWN = Path(str(resources.files("grpc_tools") / "_proto"))

ALL = """
syntax = "proto3";
package acme.v1;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/any.proto";
enum Color { COLOR_UNSPECIFIED = 0; RED = 1; GREEN = 2; }
message Inner { string name = 1; int32 n = 2; Color c = 3; }
message All {
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint32 s32 = 5;
  sint64 s64 = 6; fixed32 f32 = 7; fixed64 f64 = 8; sfixed32 sf32 = 9; sfixed64 sf64 = 10;
  float fl = 11; double db = 12; bool b = 13; string s = 14; bytes by = 15;
  Color color = 16; Inner inner = 17; repeated int64 nums = 18; repeated Inner inners = 19;
  map<string, int64> m = 20; map<int32, Inner> mi = 21;
  oneof choice { string oa = 22; int64 ob = 23; }
  google.protobuf.Timestamp ts = 24; google.protobuf.Duration du = 25;
  google.protobuf.Int32Value wi = 26; google.protobuf.StringValue ws = 27;
  google.protobuf.Struct st = 28; google.protobuf.Value va = 29;
  google.protobuf.ListValue lv = 30; google.protobuf.Any an = 31;
  optional string opt = 32; repeated Color colors = 33; map<bool, string> mb = 34;
  google.protobuf.UInt64Value wu = 35; repeated google.protobuf.Timestamp tss = 36;
  map<string, google.protobuf.Value> mv = 37;
}
"""

ALL_COLUMNS = [
    ("i32", "int", 1), ("i64", "long", 2), ("u32", "long", 3), ("u64", "decimal(20,0)", 4),
    ("s32", "int", 5), ("s64", "long", 6), ("f32", "long", 7), ("f64", "decimal(20,0)", 8),
    ("sf32", "int", 9), ("sf64", "long", 10), ("fl", "float", 11), ("db", "double", 12),
    ("b", "boolean", 13), ("s", "string", 14), ("by", "binary", 15),
    ("color", "string", 16), ("inner", "struct<name: string, n: int, c: string>", 17),
    ("nums", "list<long>", 18),
    ("inners", "list<struct<name: string, n: int, c: string>>", 19),
    ("m", "map<string,long>", 20),
    ("mi", "map<string,struct<name: string, n: int, c: string>>", 21),
    ("oa", "string", 22), ("ob", "long", 23), ("ts", "timestamp", 24), ("du", "long", 25),
    ("wi", "int", 26), ("ws", "string", 27), ("st", "json", 28), ("va", "json", 29),
    ("lv", "json", 30), ("an", "struct<type_url: string, value: binary>", 31),
    ("opt", "string", 32), ("colors", "list<string>", 33), ("mb", "map<string,string>", 34),
    ("wu", "decimal(20,0)", 35), ("tss", "list<timestamp>", 36), ("mv", "map<string,json>", 37),
]


# -- helpers -------------------------------------------------------------------------------


def protoc(tmp_path: Path, files: dict[str, str], *, include_imports: bool = True,
           out: str = "set.binpb") -> bytes:
    """The descriptor set protoc writes for ``files`` (name → .proto text)."""
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text, encoding="utf-8")
    target = tmp_path / out
    args = [sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"-I{WELL_KNOWN}",
            f"--descriptor_set_out={target}"]
    if include_imports:
        args.append("--include_imports")
    result = subprocess.run([*args, *files], capture_output=True, text=True, check=False,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return target.read_bytes()


def classes(data: bytes) -> dict[str, Any]:
    """Message classes built from the descriptor set in their own pool: encoding does not
    go through the code under test."""
    parsed = descriptor_pb2.FileDescriptorSet.FromString(data)
    return message_factory.GetMessages(list(parsed.file))


@pytest.fixture(scope="module")
def all_set(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return protoc(tmp_path_factory.mktemp("all"), {"acme/v1/all.proto": ALL})


def full_message(cls: Any) -> Any:
    inner = classes_of(cls)["acme.v1.Inner"]
    m = cls(i32=-7, i64=-(2**62), u32=2**32 - 1, u64=2**64 - 1, s32=-5, s64=-(2**40),
            f32=4_000_000_000, f64=2**63 + 5, sf32=-9, sf64=-(2**50), fl=1.5, db=-2.25,
            b=True, s="héllo", by=b"\x00\xff", color=2,
            inner=inner(name="in", n=3, c=1), nums=[1, -2, 3],
            inners=[inner(name="a", n=1), inner(name="b", c=2)], m={"k": 9},
            mi={-4: inner(name="neg")}, ob=77, opt="", colors=[1, 5], mb={False: "f"})
    m.ts.FromMicroseconds(1_700_000_000_123_456)
    m.du.FromMicroseconds(-1_500_250)
    m.wi.value = 0
    m.st.update({"a": [1, "x", None], "b": {"c": True}})
    m.va.string_value = "v"
    m.lv.extend([2, "y"])
    m.an.Pack(inner(name="packed"))
    m.wu.value = 2**64 - 2
    m.tss.add().FromMicroseconds(0)
    m.mv["z"].number_value = 2.5
    return m


def classes_of(cls: Any) -> dict[str, Any]:
    return {"acme.v1.Inner": message_factory.GetMessageClass(
        cls.DESCRIPTOR.file.message_types_by_name["Inner"])}


FULL_EXPECTED: dict[str, Any] = {
    "i32": -7, "i64": -(2**62), "u32": 2**32 - 1, "u64": Decimal(2**64 - 1), "s32": -5,
    "s64": -(2**40), "f32": 4_000_000_000, "f64": Decimal(2**63 + 5), "sf32": -9,
    "sf64": -(2**50), "fl": 1.5, "db": -2.25, "b": True, "s": "héllo", "by": b"\x00\xff",
    "color": "GREEN", "inner": {"name": "in", "n": 3, "c": "RED"}, "nums": [1, -2, 3],
    "inners": [{"name": "a", "n": 1, "c": "COLOR_UNSPECIFIED"},
               {"name": "b", "n": 0, "c": "GREEN"}],
    "m": [("k", 9)], "mi": [("-4", {"name": "neg", "n": 0, "c": "COLOR_UNSPECIFIED"})],
    "oa": None, "ob": 77,
    "ts": dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC),
    "du": -1_500_250, "wi": 0, "ws": None,
    "st": '{"a":[1.0,"x",null],"b":{"c":true}}', "va": '"v"', "lv": '[2.0,"y"]',
    "an": {"type_url": "type.googleapis.com/acme.v1.Inner", "value": b"\n\x06packed"},
    "opt": "", "colors": ["RED", "5"], "mb": [("false", "f")], "wu": Decimal(2**64 - 2),
    "tss": [dt.datetime(1970, 1, 1, tzinfo=dt.UTC)], "mv": [("z", "2.5")],
}


def values(table: pa.Table) -> list[dict[str, Any]]:
    rows = table.to_pylist()
    for row in rows:  # pyarrow gives a zoneinfo UTC; compare instants
        for key in ("ts",):
            if row.get(key) is not None:
                row[key] = row[key].astimezone(dt.UTC)
        if row.get("tss"):
            row["tss"] = [t.astimezone(dt.UTC) for t in row["tss"]]
    return rows


# -- the mapping ---------------------------------------------------------------------------


def test_should_map_every_field_kind_to_its_column_type(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All")
    assert kind.full_name == "acme.v1.All"
    got = [(c.name, c.type, c.field_number) for c in kind.columns()]
    assert got == ALL_COLUMNS
    assert not any(c.required for c in kind.columns())
    assert "microseconds" in next(c.doc for c in kind.columns() if c.name == "du")


def test_should_decode_every_mapping_into_arrow_values(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All")
    cls = classes(all_set)["acme.v1.All"]
    other = cls(oa="chosen", i32=1)
    decoded = decode_protobuf(kind, [full_message(cls).SerializeToString(), b"",
                                     other.SerializeToString()])
    expected_schema = pa.schema([pa.field(c.name, arrow_type(c.type))
                                 for c in kind.columns()])
    assert decoded.table.schema == expected_schema == protobuf_schema(kind)
    assert decoded.failed == []
    full, empty, chosen = values(decoded.table)
    assert full == FULL_EXPECTED
    # an empty message: proto3 scalars read as their defaults (as Protobuf reads them),
    # messages, wrappers, well-known types and unset oneof members as null
    assert empty["i32"] == 0
    assert empty["s"] == ""
    assert empty["color"] == "COLOR_UNSPECIFIED"
    for name in ("inner", "ts", "du", "wi", "ws", "st", "va", "lv", "an", "opt", "oa",
                 "ob", "wu"):
        assert empty[name] is None, name
    assert empty["nums"] == []
    assert empty["m"] == []
    assert (chosen["oa"], chosen["ob"], chosen["i32"]) == ("chosen", None, 1)


def test_should_decode_an_arrow_binary_array_like_a_list(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All")
    cls = classes(all_set)["acme.v1.All"]
    payloads = [full_message(cls).SerializeToString(), cls(i32=3).SerializeToString()]
    from_list = decode_protobuf(kind, payloads).table
    from_array = decode_protobuf(kind, pa.array(payloads, pa.binary())).table
    assert from_array.equals(from_list)


def test_should_give_enums_as_numbers_when_asked(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All", enums="int")
    types = {c.name: c.type for c in kind.columns()}
    assert types["color"] == "int"
    assert types["colors"] == "list<int>"
    assert types["inner"] == "struct<name: string, n: int, c: int>"
    cls = classes(all_set)["acme.v1.All"]
    table = decode_protobuf(kind, [full_message(cls).SerializeToString()]).table
    row = table.to_pylist()[0]
    assert (row["color"], row["colors"], row["inner"]["c"]) == (2, [1, 5], 1)
    assert table.schema == protobuf_schema(kind)


def test_should_mark_only_proto2_required_fields_required(tmp_path: Path) -> None:
    data = protoc(tmp_path, {"p2.proto": """
        syntax = "proto2";
        package old;
        message Legacy { required string id = 1; optional int32 n = 2; repeated string t = 3; }
    """})
    kind = ProtobufType.from_descriptor_set(data, "old.Legacy")
    assert [(c.name, c.required) for c in kind.columns()] == [
        ("id", True), ("n", False), ("t", False)]
    cls = classes(data)["old.Legacy"]
    kind.check(cls(id="x").SerializeToString())
    nested = protoc(tmp_path, {"p2n.proto": """
        syntax = "proto2";
        package old;
        message Part { required int32 id = 1; }
        message Whole { optional Part part = 1; }
    """}, out="nested.binpb")
    with pytest.raises(TypedPayloadError, match=r"part\.id") as deep:
        ProtobufType.from_descriptor_set(nested, "old.Whole").check(b"\x0a\x00")
    assert deep.value.field == "part.id"
    with pytest.raises(TypedPayloadError, match=r"required field.*: id") as caught:
        kind.check(cls(n=1).SerializePartialToString())
    assert caught.value.field == "id"
    row = decode_protobuf(kind, [cls(id="x").SerializeToString()]).table.to_pylist()[0]
    assert row == {"id": "x", "n": None, "t": []}  # proto2 optional has presence


def test_should_resolve_well_known_types_the_set_does_not_hold(all_set: bytes) -> None:
    parsed = descriptor_pb2.FileDescriptorSet.FromString(all_set)
    own = descriptor_pb2.FileDescriptorSet()
    own.file.extend(f for f in parsed.file if not f.name.startswith("google/protobuf/"))
    assert len(own.file) == 1
    kind = ProtobufType.from_descriptor_set(own.SerializeToString(), "acme.v1.All")
    assert [(c.name, c.type, c.field_number) for c in kind.columns()] == ALL_COLUMNS
    cls = classes(all_set)["acme.v1.All"]
    table = decode_protobuf(kind, [full_message(cls).SerializeToString()]).table
    assert values(table)[0] == FULL_EXPECTED


def test_should_take_the_registrys_files_importing_several_well_known_types(
        tmp_path: Path) -> None:
    """The registry's route: .proto text compiled by the registry, its ``Parsed.files``
    (before, the registry refused a schema importing two well-known types: it built a pool
    after adding each import, which missed the next)."""
    parsed = formats.parse("PROTOBUF", ALL, {})
    kind = ProtobufType.from_files(list(parsed.files.values()), ".acme.v1.All")
    assert [(c.name, c.type, c.field_number) for c in kind.columns()] == ALL_COLUMNS


def test_should_read_a_buf_image(tmp_path: Path) -> None:
    buf = shutil.which("buf") or shutil.which("buf", path=str(Path(sys.executable).parent))
    if buf is None:
        pytest.skip("buf is not installed (pip install buf-bin puts it in the venv)")
    module = tmp_path / "mod"
    (module / "acme/v1").mkdir(parents=True)
    (module / "acme/v1/all.proto").write_text(ALL, encoding="utf-8")
    (module / "buf.yaml").write_text("version: v2\n", encoding="utf-8")
    image = tmp_path / "image.binpb"
    result = subprocess.run([buf, "build", str(module), "-o", str(image)],
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    kind = ProtobufType.from_descriptor_set(image.read_bytes(), "acme.v1.All",
                                            origin=str(image))
    assert [(c.name, c.type, c.field_number) for c in kind.columns()] == ALL_COLUMNS
    cls = classes(image.read_bytes())["acme.v1.All"]
    assert values(decode_protobuf(kind, [full_message(cls).SerializeToString()]).table
                  )[0] == FULL_EXPECTED


def test_should_survive_pickling_for_spark_tasks(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All", enums="int")
    again = pickle.loads(pickle.dumps(kind))
    assert again.columns() == kind.columns()
    assert again.enums == "int"
    assert again.number_paths() == kind.number_paths()


# -- refusals of descriptors ---------------------------------------------------------------


def test_should_name_the_file_and_the_import_a_set_misses(tmp_path: Path) -> None:
    data = protoc(tmp_path, {
        "acme/common.proto": 'syntax = "proto3"; package acme; message Money { int64 units = 1; }',
        "acme/orders.proto": 'syntax = "proto3"; package acme; import "acme/common.proto"; '
                             'import "google/protobuf/timestamp.proto"; '
                             "message Order { Money total = 1; "
                             "google.protobuf.Timestamp at = 2; }"},
        include_imports=False)
    only_orders = descriptor_pb2.FileDescriptorSet.FromString(data)
    kept = descriptor_pb2.FileDescriptorSet()
    kept.file.extend(f for f in only_orders.file if f.name == "acme/orders.proto")
    with pytest.raises(DescriptorError) as caught:
        ProtobufType.from_descriptor_set(kept.SerializeToString(), "acme.Order",
                                         origin="orders.binpb")
    text = str(caught.value)
    assert "orders.binpb" in text
    assert "'acme/orders.proto'" in text
    assert "'acme/common.proto'" in text
    assert "--include_imports" in text
    # the timestamp import is a well-known type: not what it complains about
    assert "timestamp" not in text


def test_should_name_messages_that_exist_for_an_unknown_one(all_set: bytes) -> None:
    with pytest.raises(DescriptorError) as caught:
        ProtobufType.from_descriptor_set(all_set, "acme.v1.Missing")
    assert "'acme.v1.Missing'" in str(caught.value)
    assert "acme.v1.Inner" in str(caught.value)
    assert "acme.v1.All" in str(caught.value)
    assert "MiEntry" not in str(caught.value)  # map entries are not messages to name
    files = {f.name: f for f in descriptor_pb2.FileDescriptorSet.FromString(all_set).file}
    names = message_names(files)
    assert {"acme.v1.Inner", "acme.v1.All", "google.protobuf.Timestamp"} <= set(names)
    assert not any(n.endswith("Entry") for n in names)


def test_should_refuse_a_descriptor_set_that_does_not_parse(all_set: bytes) -> None:
    with pytest.raises(DescriptorError, match=r"image\.binpb does not parse as a "
                                              r"FileDescriptorSet"):
        ProtobufType.from_descriptor_set(b"\x0a\xff\xff", "acme.v1.All", origin="image.binpb")
    with pytest.raises(DescriptorError, match="holds no file"):
        ProtobufType.from_descriptor_set(b"", "acme.v1.All")


def test_should_refuse_a_recursive_message_naming_the_field_path(tmp_path: Path) -> None:
    data = protoc(tmp_path, {"tree.proto": """
        syntax = "proto3";
        package t;
        message Node { string label = 1; Wrap wrap = 2; }
        message Wrap { repeated Node children = 1; }
        message Root { Node root = 1; }
    """})
    with pytest.raises(DescriptorError) as caught:
        ProtobufType.from_descriptor_set(data, "t.Root")
    assert "field root.wrap.children holds t.Node" in str(caught.value)  # where it recurs
    assert "t.Node" in str(caught.value)
    assert "contains itself" in str(caught.value)


# -- payloads ------------------------------------------------------------------------------


def test_should_check_payloads_naming_the_field(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All")
    cls = classes(all_set)["acme.v1.All"]
    kind.check(full_message(cls).SerializeToString())
    kind.check(b"")
    good = cls(inner={"name": "abc"}).SerializeToString()
    cases = {
        good[:-1]: ("truncated", "inner"),                     # cut inside a nested message
        b"\x8a\x01\x03\x0a\x01\xff": ("UTF-8", "inner.name"),  # invalid UTF-8, nested
        b"\x72\x02\xc3\x28": ("UTF-8", "s"),
        b"\x0d\x01\x00\x00\x00": ("32-bit", "i32"),           # wrong wire type, top level
        b"\x8a\x01\x05\x15\x01\x00\x00\x00": ("32-bit", "inner.n"),  # and nested
        b"\x9a\x01\x05\x15\x01\x00\x00\x00": ("32-bit", "inners.n"),  # in a list
        b"\xaa\x01\x09\x08\x01\x12\x05\x15\x01\x00\x00\x00": ("32-bit", "mi.value.n"),
        b"\x08": ("truncated", "i32"),
    }
    for payload, (words, field) in cases.items():
        with pytest.raises(TypedPayloadError, match=words) as caught:
            kind.check(payload)
        assert caught.value.field == field, (payload, str(caught.value))
        assert "acme.v1.All" in str(caught.value)


def test_should_check_a_requests_messages_in_one_parse_as_each_alone(all_set: bytes) -> None:
    """``check_many`` (the ingestor's one-parse path) says True exactly when every payload
    passes ``check``: a truncated, non-UTF-8, wrongly typed or empty one among good ones
    makes it False (the caller then checks each for the reason)."""
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All")
    cls = classes(all_set)["acme.v1.All"]
    good = [full_message(cls).SerializeToString(),
            cls(inner={"name": "abc"}).SerializeToString()] * 3
    assert kind.check_many(good)
    assert kind.check_many([])
    for bad in (good[1][:-1], b"\x8a\x01\x03\x0a\x01\xff", b"\x72\x02\xc3\x28",
                b"\x0d\x01\x00\x00\x00", b"\x9a\x01\x05\x15\x01\x00\x00\x00", b"\x08", b""):
        assert not kind.check_many([*good, bad, good[0]]), bad


def test_should_accept_fields_a_newer_producer_added(tmp_path: Path) -> None:
    v1 = protoc(tmp_path, {"e.proto": 'syntax = "proto3"; package e; '
                                      "message E { string id = 1; Sub sub = 2; } "
                                      "message Sub { int32 a = 1; }"}, out="v1.binpb")
    v2 = protoc(tmp_path, {"e.proto": 'syntax = "proto3"; package e; '
                                      "message E { string id = 1; Sub sub = 2; "
                                      "repeated string extra = 9; } "
                                      "message Sub { int32 a = 1; double b = 7; }"},
                out="v2.binpb")
    newer = classes(v2)["e.E"](id="x", extra=["y"], sub={"a": 1, "b": 2.5})
    kind = ProtobufType.from_descriptor_set(v1, "e.E")
    kind.check(newer.SerializeToString())
    rows = decode_protobuf(kind, [newer.SerializeToString()]).table.to_pylist()
    assert rows == [{"id": "x", "sub": {"a": 1}}]


def test_should_decode_the_good_rows_of_a_batch_and_name_the_bad(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All")
    cls = classes(all_set)["acme.v1.All"]
    payloads = [cls(i32=i, s=f"row {i}").SerializeToString() for i in range(40)]
    payloads[3] = b"\x72\x02\xc3\x28"           # invalid UTF-8 in s
    payloads[17] = payloads[16][:-2]            # truncated
    payloads[39] = b"\x8a\x01\x03\x0a\x01\xff"  # invalid UTF-8 in inner.name
    decoded = decode_protobuf(kind, payloads)
    table, failed = decoded  # what the collector unpacks
    assert table is decoded.table
    assert [i for i, _ in failed] == [3, 17, 39]
    assert "string field s is not valid UTF-8" in failed[0][1]
    assert "truncated" in failed[1][1]
    assert "s" in failed[1][1]
    assert "string field inner.name is not valid UTF-8" in failed[2][1]
    kept = decoded.kept(len(payloads)).to_pylist()
    assert kept == [i for i in range(40) if i not in (3, 17, 39)]
    assert decoded.table.column("i32").to_pylist() == kept
    assert decoded.table.column("s").to_pylist() == [f"row {i}" for i in kept]
    assert decoded.table.schema == protobuf_schema(kind)
    nothing = decode_protobuf(kind, [])
    assert nothing.table.num_rows == 0
    assert nothing.failed == []
    assert nothing.table.schema == protobuf_schema(kind)
    every_row_bad = decode_protobuf(kind, [b"\x08"])
    assert every_row_bad.table.num_rows == 0
    assert len(every_row_bad.failed) == 1
    assert every_row_bad.table.schema == protobuf_schema(kind)


def test_should_turn_canonical_json_into_the_binary_encoding(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All")
    cls = classes(all_set)["acme.v1.All"]
    body = (b'{"i32": -7, "u64": "18446744073709551615", "color": "GREEN", '
            b'"inner": {"name": "in", "c": "RED"}, "ts": "2023-11-14T22:13:20.123456Z", '
            b'"du": "-1.500250s", "st": {"a": [1, "x"]}, "mb": {"false": "f"}, '
            b'"mi": {"-4": {"name": "neg"}}, "wi": 0}')
    binary = kind.from_json(body)
    expected = cls(i32=-7, u64=2**64 - 1, color=2, inner={"name": "in", "c": 1},
                   mb={False: "f"}, mi={-4: {"name": "neg"}})
    expected.ts.FromMicroseconds(1_700_000_000_123_456)
    expected.du.FromMicroseconds(-1_500_250)
    expected.st.update({"a": [1, "x"]})
    expected.wi.value = 0
    assert cls.FromString(binary) == expected
    row = decode_protobuf(kind, [binary]).table.to_pylist()[0]
    assert (row["du"], row["u64"], row["mi"]) == (-1_500_250, Decimal(2**64 - 1),
                                                  [("-4", {"name": "neg", "n": 0,
                                                           "c": "COLOR_UNSPECIFIED"})])
    assert kind.to_json(binary).startswith(b'{"i32":-7,')


def test_should_refuse_json_naming_the_field(all_set: bytes) -> None:
    kind = ProtobufType.from_descriptor_set(all_set, "acme.v1.All")
    cases = {
        b'{"i32": "seven"}': "i32",
        b'{"inner": {"n": "x"}}': "inner.n",
        b'{"inner": {"nope": 1}}': "inner.nope",
        b'{"color": "PURPLE"}': "color",
        b'{"ts": "yesterday"}': "ts",
    }
    for body, field in cases.items():
        with pytest.raises(TypedPayloadError) as caught:
            kind.from_json(body)
        assert caught.value.field == field, (body, str(caught.value))
    with pytest.raises(TypedPayloadError, match=r"not JSON|Failed to load JSON"):
        kind.from_json(b"{")


# -- evolution -----------------------------------------------------------------------------

V1 = """
syntax = "proto3";
package shop;
message Line { string sku = 1; int32 qty = 2; }
message Address { string city = 1; string zip = 2; }
message Customer { string name = 1; Address address = 2; }
message Order {
  string id = 1; Customer customer = 3; repeated Line lines = 7;
  map<string, Address> labels = 9; int32 count = 10; sint64 delta = 11;
}
"""


def versions(tmp_path: Path, v2: str) -> tuple[ProtobufType, ProtobufType]:
    one = protoc(tmp_path, {"shop.proto": V1}, out="v1.binpb")
    two = protoc(tmp_path, {"shop.proto": v2}, out="v2.binpb")
    return (ProtobufType.from_descriptor_set(one, "shop.Order"),
            ProtobufType.from_descriptor_set(two, "shop.Order"))


def test_should_find_renames_by_number_path_at_every_depth(tmp_path: Path) -> None:
    v2 = (V1.replace("string city = 1", "string town = 1")
          .replace("Customer customer = 3", "Customer buyer = 3")
          .replace("string sku = 1", "string product = 1")
          .replace("int32 count = 10", "int64 total = 10"))  # renamed and widened
    old, new = versions(tmp_path, v2)
    assert old.number_paths() == {
        "1": "id", "3": "customer", "3.1": "customer.name", "3.2": "customer.address",
        "3.2.1": "customer.address.city", "3.2.2": "customer.address.zip",
        "7": "lines", "7.1": "lines.sku", "7.2": "lines.qty",
        "9": "labels", "9.2.1": "labels.city", "9.2.2": "labels.zip",
        "10": "count", "11": "delta"}
    assert new.number_paths()["3.2.1"] == "buyer.address.town"
    assert new.renames(old) == [
        ("customer", "buyer"), ("customer.address.city", "buyer.address.town"),
        ("lines.sku", "lines.product"),
        ("labels.city", "labels.town"), ("count", "total")]
    assert new.incompatibilities(old) == []
    new.require_compatible(old)
    assert old.renames(old) == []
    # a table that stored v1's number paths, meeting v3 (renamed again): v1's paths -> v3's
    v3 = protoc(tmp_path, {"shop.proto": v2.replace("string town = 1", "string place = 1")},
                out="v3.binpb")
    third = ProtobufType.from_descriptor_set(v3, "shop.Order")
    stored = json.loads(json.dumps(old.number_paths()))  # as a table property holds it
    assert third.renames_from(stored) == [
        ("customer", "buyer"), ("customer.address.city", "buyer.address.place"),
        ("lines.sku", "lines.product"),
        ("labels.city", "labels.place"), ("count", "total")]
    assert third.renames_from(third.number_paths()) == []


def test_should_refuse_a_field_number_reused_with_another_type(tmp_path: Path) -> None:
    v2 = (V1.replace("string zip = 2", "int64 zip = 2")          # nested, in a struct
          .replace("int32 qty = 2", "repeated int32 qty = 2")    # cardinality, in a list
          .replace("sint64 delta = 11", "int64 delta = 11")      # same column, other wire
          .replace("string id = 1", "int64 id = 1"))
    old, new = versions(tmp_path, v2)
    problems = new.incompatibilities(old)
    assert len(problems) == 5, problems
    by_field = {p.split(" (")[0]: p for p in problems}
    assert set(by_field) == {"field id", "field customer.address.zip", "field lines.qty",
                             "field labels.zip", "field delta"}
    assert "number 3.2.2" in by_field["field customer.address.zip"]
    assert "was string (string), now int64 (long)" in by_field["field customer.address.zip"]
    assert "was int32 (int), now repeated int32 (list<int>)" in \
        by_field["field lines.qty"]
    assert "sint64" in by_field["field delta"]
    assert "wire" in by_field["field delta"]
    with pytest.raises(TypeChangeError, match=r"customer\.address\.zip"):
        new.require_compatible(old)


def test_should_let_a_table_follow_compatible_changes(tmp_path: Path) -> None:
    v2 = (V1.replace("int32 count = 10", "int64 count = 10")        # int -> long
          .replace("string zip = 2", "string zip = 2; string country = 3")  # added
          .replace("sint64 delta = 11;", "")                       # removed
          .replace("string id = 1", "string id = 1; optional string note = 12"))
    old, new = versions(tmp_path, v2)
    assert new.incompatibilities(old) == []
    assert new.renames(old) == []
    assert "3.2.3" in new.number_paths()
    assert "11" not in new.number_paths()


def test_should_decode_a_message_of_any_file_in_the_set(tmp_path: Path) -> None:
    data = protoc(tmp_path, {
        "a.proto": 'syntax = "proto3"; package a; message First { string id = 1; }',
        "b.proto": 'syntax = "proto3"; package b; message Second { int64 n = 1; }'})
    for name, message, row in (("a.First", {"id": "x"}, {"id": "x"}),
                               ("b.Second", {"n": 5}, {"n": 5})):
        kind = ProtobufType.from_descriptor_set(data, name)
        payload = classes(data)[name](**message).SerializeToString()
        assert decode_protobuf(kind, [payload]).table.to_pylist() == [row]


def test_should_give_no_column_to_a_message_without_fields(tmp_path: Path) -> None:
    data = protoc(tmp_path, {"e.proto": """
        syntax = "proto3";
        package e;
        import "google/protobuf/empty.proto";
        message Nothing {}
        message Sub { google.protobuf.Empty e = 1; int32 a = 2; Nothing n = 3; }
        message E { google.protobuf.Empty e = 1; Sub sub = 2; repeated Sub subs = 3; }
    """})
    kind = ProtobufType.from_descriptor_set(data, "e.E")
    assert [(c.name, c.type) for c in kind.columns()] == [
        ("sub", "struct<a: int>"), ("subs", "list<struct<a: int>>")]
    message = classes(data)["e.E"](sub={"a": 3}, subs=[{"a": 4}])
    message.e.SetInParent()
    decoded = decode_protobuf(kind, [message.SerializeToString()]).table
    assert decoded.to_pylist() == [{"sub": {"a": 3}, "subs": [{"a": 4}]}]
    assert decoded.schema == protobuf_schema(kind)


def test_should_refuse_messages_nested_deeper_than_a_column_type_may(tmp_path: Path) -> None:
    def chain(levels: int) -> str:
        body = "".join(f"message M{i} {{ M{i + 1} next = 1; }}\n" for i in range(levels))
        return f'syntax = "proto3"; package d;\n{body}message M{levels} {{ int32 v = 1; }}\n'

    fits = ProtobufType.from_descriptor_set(protoc(tmp_path, {"ok.proto": chain(16)},
                                                   out="ok.binpb"), "d.M0")
    assert fits.columns()[0].type.count("struct<") == 16
    parse_type(fits.columns()[0].type)  # the deepest type a column may have
    with pytest.raises(DescriptorError, match=r"nests deeper than 16") as caught:
        ProtobufType.from_descriptor_set(protoc(tmp_path, {"deep.proto": chain(17)},
                                                out="deep.binpb"), "d.M0")
    assert "next.next" in str(caught.value)


def test_should_plug_into_the_collectors_typed_decode(all_set: bytes) -> None:
    """``pipeline.load.typed`` (the lead's routing) with this decoder: good rows kept in
    order, a corrupt payload and a JSON record reported by position."""
    import base64

    from icefloe.formats.envelope import TypedRecords
    from icefloe.typed.codec import FORMAT_JSON, FORMAT_PROTOBUF
    from icefloe.typed.kinds import protobuf_kind
    from pipeline.load.spec import TypedPlan, TypedSpec
    from pipeline.load.typed import decode_typed

    text = base64.b64encode(all_set).decode()
    spec = TypedSpec("protobuf", text, "acme.v1.All")
    plan = TypedPlan(protobuf_schema(protobuf_kind(text, "acme.v1.All")), spec)
    cls = classes(all_set)["acme.v1.All"]
    payloads = [cls(i32=1).SerializeToString(), b"\x72\x02\xc3\x28", b'{"i32": 3}',
                cls(i32=4).SerializeToString()]
    rows = TypedRecords("s", payloads=payloads,
                        formats=[FORMAT_PROTOBUF, FORMAT_PROTOBUF, FORMAT_JSON,
                                 FORMAT_PROTOBUF], schema_ids=[0, 0, 0, 0])
    decoded = decode_typed(rows, plan)
    assert decoded.kept.tolist() == [0, 3]
    assert decoded.table.column("i32").to_pylist() == [1, 4]
    assert [(p, reason) for p, reason, _ in decoded.bad] == [
        (1, "payload_mismatch"), (2, "payload_format")]
    assert "string field s is not valid UTF-8" in decoded.bad[0][2]


@pytest.mark.parametrize(("old", "new", "refused"), [
    ("int32", "int64", False), ("sint32", "sint64", False), ("uint32", "uint64", False),
    ("enum acme.Color", "int32", False), ("string", "bytes", False),
    ("int32", "sint32", True), ("int32", "uint32", True), ("int64", "uint64", True),
    ("int32", "bool", True), ("fixed32", "sfixed32", True), ("float", "double", True),
    ("fixed64", "double", True), ("map<string, int32>", "map<int32, int32>", True),
    ("acme.Inner", "acme.Other", False),  # a message: its fields are judged by number
])
def test_an_encoding_change_that_misreads_old_payloads_is_named(old, new, refused):
    from icefloe.typed.protobuf import encoding_change

    why = encoding_change(old, new)
    assert bool(why) is refused, why
