"""The schema registry's core: compare-and-swap on a real moto S3 bucket (two stores racing),
history that cannot be rewritten, canonical identity, and the compatibility rules per type
(Avro's resolution rules, Protobuf field numbers, the JSON Schema keywords checked)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import msgspec
import pytest

from icefloe.clock import ManualClock
from icefloe.errors import SchemaRegistryError
from icefloe.schemas import compat, formats
from icefloe.schemas.model import Reference, SchemaRecord
from icefloe.schemas.store import Candidate, SchemaStore
from icefloe.store import open_async_store, options_for


def avro(text: str) -> formats.Parsed:
    return formats.parse("AVRO", text, {})


def record(*fields: str, name: str = "R") -> str:
    return f'{{"type":"record","name":"{name}","fields":[{",".join(fields)}]}}'


@pytest.mark.s3
async def test_two_stores_race_by_cas_on_s3(s3_bucket: Any) -> None:
    opened = [open_async_store(s3_bucket.url, options_for(s3_bucket.endpoint_url, None))
              for _ in range(2)]
    try:
        left, right = (SchemaStore(s) for s in opened)
        jobs = [(left if i % 2 else right).register(f"s{i}", Candidate(
            "AVRO", f'{{"type":"fixed","name":"F{i}","size":{i + 1}}}')) for i in range(10)]
        same = Candidate("AVRO", '{"type":"enum","name":"E","symbols":["A"]}')
        jobs += [left.register("x", same), right.register("x", same)]
        results = await asyncio.gather(*jobs)
        assert left.stats.conflicts + right.stats.conflicts > 0  # they did race
        assert results[-1] == results[-2]  # one schema, one id, one version
        assert results[-1][1] == 1
        assert sorted({i for i, _ in results}) == list(range(1, 12))
        doc = await left.read()
        assert doc.next_id == 12
        assert [len(s.versions) for s in doc.subjects] == [1] * 11
    finally:
        for store in opened:
            await store.close()


async def test_history_is_never_rewritten(tmp_path: Path) -> None:
    clock = ManualClock(start=1_000.0)
    schemas = SchemaStore(open_async_store(tmp_path.as_uri()), clock=clock)
    assert await schemas.register("a", Candidate("AVRO", '"int"')) == (1, 1)
    before = await schemas.read()
    assert before.schemas[0].registered_at == 1_000.0  # the injected clock stamps it

    def replace(doc: Any) -> Any:
        forged = SchemaRecord(1, "AVRO", '"long"', '"long"')
        return msgspec.structs.replace(doc, schemas=(forged,))

    with pytest.raises(AssertionError, match="schema id 1 would change"):
        await schemas._update(replace)

    def reuse(doc: Any) -> Any:
        return msgspec.structs.replace(doc, next_id=1)

    with pytest.raises(AssertionError, match="reused"):
        await schemas._update(reuse)
    assert await schemas.read() == before  # nothing written


async def test_keep_adds_a_schema_under_no_subject_once(tmp_path: Path) -> None:
    """What an ingestor keeps an Avro stream's schema with: one id per schema, written
    once, the id a later registration under a subject takes."""
    schemas = SchemaStore(open_async_store(tmp_path.as_uri()), clock=ManualClock(start=5.0))
    text = record('{"name":"a","type":"int"}')
    assert await schemas.register("a", Candidate("AVRO", '"int"')) == (1, 1)
    assert await schemas.keep(Candidate("AVRO", text)) == 2
    kept = await schemas.read()
    assert (kept.next_id, kept.schemas[1].registered_at) == (3, 5.0)
    assert [s.name for s in kept.subjects] == ["a"]
    spaced = text.replace(",", ", ")
    assert await schemas.keep(Candidate("AVRO", spaced)) == 2  # the same schema: no write
    assert await schemas.read() == kept
    assert await schemas.keep(Candidate("AVRO", '"int"')) == 1  # a subject's: its id
    assert await schemas.register("b", Candidate("AVRO", text)) == (2, 1)


async def test_identity_is_canonical(tmp_path: Path) -> None:
    schemas = SchemaStore(open_async_store(tmp_path.as_uri()))
    spaced = '{ "fields": [ {"type": "int", "name": "a"} ], "name": "R", "type": "record" }'
    assert await schemas.register("a", Candidate("AVRO", record('{"name":"a","type":"int"}'))
                                  ) == (1, 1)
    assert await schemas.register("a", Candidate("AVRO", spaced)) == (1, 1)
    # a default is part of the schema: another id
    defaulted = record('{"name":"a","type":"int","default":0}')
    assert await schemas.register("a", Candidate("AVRO", defaulted)) == (2, 2)
    # Protobuf: .proto text and the base64 descriptor of a file are one schema
    from google.protobuf import timestamp_pb2

    encoded = base64.b64encode(timestamp_pb2.DESCRIPTOR.serialized_pb).decode()
    text = (Path(formats._well_known_dir()) / "google/protobuf/timestamp.proto").read_text()
    first = await schemas.register("ts", Candidate("PROTOBUF", encoded))
    assert await schemas.register("ts", Candidate("PROTOBUF", text)) == first


async def test_avro_references_resolve_named_types_of_other_subjects(tmp_path: Path) -> None:
    schemas = SchemaStore(open_async_store(tmp_path.as_uri()))
    money = ('{"type":"record","name":"Money","namespace":"acme","fields":['
             '{"name":"units","type":"long"}]}')
    assert await schemas.register("money", Candidate("AVRO", money)) == (1, 1)
    order = record('{"name":"total","type":"acme.Money"}', name="Order")
    with pytest.raises(SchemaRegistryError, match=r"acme\.Money") as info:
        await schemas.register("order", Candidate("AVRO", order))  # not named: unknown
    assert info.value.error_code == 42201
    ref = (Reference("acme.Money", "money", 1),)
    assert await schemas.register("order", Candidate("AVRO", order, ref)) == (2, 1)
    doc = await schemas.read()
    parsed = schemas.parsed(doc, doc.schemas[1])
    assert parsed.value.fields[0].type.fullname == "acme.Money"
    with pytest.raises(SchemaRegistryError, match="no version 9"):
        await schemas.register("x", Candidate("AVRO", order, (Reference("acme.Money", "money",
                                                                         9),)))
    with pytest.raises(SchemaRegistryError) as held:  # referenced: not deleted
        await schemas.delete_subject("money", permanent=False)
    assert held.value.error_code == 42206


@pytest.mark.parametrize(("writer", "reader", "problem"), [
    ('"int"', '"long"', None),
    ('"long"', '"int"', "TYPE_MISMATCH"),
    ('"int"', '"double"', None),
    ('"long"', '"float"', None),
    ('"float"', '"double"', None),
    ('"string"', '"bytes"', None),
    ('"bytes"', '"string"', None),
    ('["null","string"]', '"string"', "writer type: null"),
    ('"string"', '["null","string"]', None),
    ('{"type":"enum","name":"E","symbols":["A","B"]}',
     '{"type":"enum","name":"E","symbols":["A"]}', "MISSING_ENUM_SYMBOLS"),
    ('{"type":"enum","name":"E","symbols":["A"]}',
     '{"type":"enum","name":"E","symbols":["A","B"]}', None),
    (record('{"name":"a","type":"int"}'), record('{"name":"a","type":"int"}',
                                                '{"name":"b","type":"int"}'),
     "READER_FIELD_MISSING_DEFAULT_VALUE"),
    (record('{"name":"a","type":"int"}'), record('{"name":"a","type":"int"}',
                                                '{"name":"b","type":"int","default":1}'), None),
    (record('{"name":"a","type":"int"}', '{"name":"b","type":"int"}'),
     record('{"name":"a","type":"int"}'), None),
    (record('{"name":"in","type":' + record('{"name":"x","type":"int"}', name="N") + '}'),
     record('{"name":"in","type":' + record('{"name":"x","type":"int"}',
                                            '{"name":"y","type":"string"}', name="N") + '}'),
     "READER_FIELD_MISSING_DEFAULT_VALUE"),
])
def test_avro_resolution_rules(writer: str, reader: str, problem: str | None) -> None:
    found = compat.readable(reader=avro(reader), writer=avro(writer))
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1
        assert problem in found[0]


def proto(text: str) -> formats.Parsed:
    return formats.parse("PROTOBUF", 'syntax = "proto3"; package p; ' + text, {})


def test_protobuf_field_numbers() -> None:
    old = proto("message M { int32 a = 1; string b = 2; message In { bool c = 1; } }")
    assert compat.readable(proto("message M { int32 a = 1; }"), old) == []  # removed
    assert compat.readable(proto("message M { int32 renamed = 1; string b = 2; }"), old) == []
    assert compat.check("FULL", proto("message M { repeated int32 a = 1; string b = 2; }"),
                        [old])[0].startswith("field p.M.a (number 1): its label changed "
                                             "from optional to repeated")
    nested = compat.readable(proto("message M { message In { string c = 1; } }"), old)
    assert nested == ["field p.M.In.c (number 1): its type changed from bool to string"]


def test_json_schema_checks_and_what_it_refuses_to_guess() -> None:
    def js(data: str) -> formats.Parsed:
        return formats.parse("JSON", data, {})

    base = js('{"type":"object","properties":{"a":{"type":"integer"}}}')
    assert compat.readable(js('{"type":"object","properties":{"a":{"type":"number"}}}'),
                           base) == []  # integers are numbers
    assert compat.readable(base, js('{"type":"object","properties":{"a":{"type":"number"}}}')
                           ) == ["#/properties/a: the type changed from ['number'] to "
                                 "['integer']"]
    closed = js('{"type":"object","properties":{"a":{"type":"integer"}},'
                '"additionalProperties":false}')
    assert compat.readable(closed, base) == ["#: additionalProperties narrowed"]
    assert compat.readable(base, closed) == []
    assert compat.readable(js('{"type":"object","properties":{"a":{"type":"integer",'
                              '"maximum":5}}}'), base)[0].startswith(
        "#/properties/a: maximum changed")
    refused = compat.readable(js('{"allOf":[{"type":"object"}]}'), base)
    assert refused[0].startswith("#: keyword 'allOf' is not checked")


def test_invalid_schemas_name_the_problem() -> None:
    with pytest.raises(SchemaRegistryError, match=r'Import "missing\.proto" was not found'
                       ) as info:
        formats.parse("PROTOBUF", 'syntax = "proto3"; import "missing.proto";', {})
    assert info.value.error_code == 42201
    from google.protobuf import descriptor_pb2

    orphan = descriptor_pb2.FileDescriptorProto(name="o.proto", dependency=["missing.proto"])
    with pytest.raises(SchemaRegistryError, match=r"import 'missing\.proto' is neither"):
        formats.parse("PROTOBUF", base64.b64encode(orphan.SerializeToString()).decode(), {})
    with pytest.raises(SchemaRegistryError, match="does not parse"):
        formats.parse("AVRO", '{"type":"record","name":"R","fields":[{"name":"a"}]}', {})
