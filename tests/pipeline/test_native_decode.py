"""The collector's decode of native values (no Spark): uuid text becomes 16 bytes for a
whole column at once, and decimals, structs, lists and maps come back exactly as the
ingestor wrote them; a value that is not what the ingestor writes still dead-letters only
its own row, with the same reason as before."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from icefloe.config import Column, StreamConfig
from icefloe.formats.batch import BatchBuilder
from icefloe.formats.envelope import frame_events
from ingestor.validate import CompiledStream
from pipeline.load import native_arrow
from pipeline.load.decode import Decoded, decode_batch_file
from pipeline.load.spec import EntryFile, stream_specs

STREAM = StreamConfig(name="s", table="a.b", columns=(
    Column("ref", "uuid"), Column("total", "decimal(12,2)"),
    Column("user", "struct<id: string, ref: uuid, age: int>"),
    Column("items", "list<struct<sku: string, price: decimal(9,2), refs: list<uuid>>>"),
    Column("attrs", "map<string,uuid>")))


def event(i: int) -> dict[str, Any]:
    ref = str(uuid.UUID(int=i * 7919 + 1))
    return {"ref": None if i % 5 == 0 else ref, "total": f"{i}.{i % 100:02d}",
            "user": {"id": f"u{i}", "ref": ref.upper(), "age": i},
            "items": [{"sku": f"k{i}", "price": "19.99", "refs": [ref, None]}, None],
            "attrs": {"a": ref, "b": None}}


def decode(payloads: list[bytes]) -> Decoded:
    ids = [f"e{i}" for i in range(len(payloads))]
    builder = BatchBuilder()
    builder.add_framed(frame_events("s", 1_700_000_000_000, ids, payloads), len(payloads))
    data = builder.finish()
    return decode_batch_file(data, EntryFile(3, "k", len(data), 0),
                             {"s": stream_specs([STREAM])[0].plan()})


def canonical(events: list[dict[str, Any]]) -> list[bytes]:
    return list(CompiledStream(STREAM).from_json(msgspec.json.encode(events)).payloads)


def expected(i: int) -> dict[str, Any]:
    ref = uuid.UUID(int=i * 7919 + 1).bytes
    return {"ref": None if i % 5 == 0 else ref, "total": Decimal(f"{i}.{i % 100:02d}"),
            "user": {"id": f"u{i}", "ref": ref, "age": i},
            "items": [{"sku": f"k{i}", "price": Decimal("19.99"), "refs": [ref, None]}, None],
            "attrs": [("a", ref), ("b", None)]}


def test_native_values_round_trip_exactly_at_every_depth():
    out = decode(canonical([event(i) for i in range(300)]))
    table = out.tables["s"]
    assert not len(out.dead)
    assert table.schema.field("ref").type == pa.binary(16)
    rows = table.select(["ref", "total", "user", "items", "attrs"]).to_pylist()
    assert rows == [expected(i) for i in range(300)]


def test_canonical_uuids_take_no_call_per_value(monkeypatch):
    payloads = canonical([event(i) for i in range(50)])
    refs = [expected(i)["ref"] for i in range(50)]
    calls = []
    real = uuid.UUID

    def counted(*args: Any, **kwargs: Any) -> uuid.UUID:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(native_arrow.uuid, "UUID", counted)
    rows = decode(payloads).tables["s"].select(["ref"]).to_pylist()
    assert [r["ref"] for r in rows] == refs
    assert calls == []


@pytest.mark.parametrize("text", [
    "{6f1c2b4e-8a0d-4c1e-9b7f-0123456789ab}", "6f1c2b4e8a0d4c1e9b7f0123456789ab",
    "urn:uuid:6f1c2b4e-8a0d-4c1e-9b7f-0123456789ab", "6F1C2B4E-8A0D-4C1E-9B7F-0123456789AB"])
def test_other_forms_python_reads_still_decode_to_the_same_bytes(text):
    """Payloads the ingestor never writes, but a hand-made batch might hold: what
    ``uuid.UUID`` makes of them, as before."""
    good = canonical([event(1)])[0]
    odd = good.replace(str(uuid.UUID(int=7920)).encode(), text.encode(), 1)
    assert odd != good
    out = decode([good, odd])
    assert not len(out.dead)
    assert out.tables["s"].column("ref").to_pylist() == [
        uuid.UUID(int=7920).bytes, uuid.UUID(text).bytes]


@pytest.mark.parametrize(("text", "why"), [
    ("6f1c2b4e-8a0d-4c1e-9b7f-0123456789ag", "invalid literal for int() with base 16"),
    ("6f1c2b4e+8a0d+4c1e+9b7f+0123456789ab", "badly formed hexadecimal UUID string"),
    ("not-a-uuid", "badly formed hexadecimal UUID string")])
def test_a_bad_uuid_dead_letters_only_its_row_with_the_reason(text, why):
    payloads = canonical([event(i) for i in range(1, 4)])
    payloads[1] = payloads[1].replace(str(uuid.UUID(int=2 * 7919 + 1)).encode(),
                                      text.encode(), 1)
    out = decode(payloads)
    assert out.tables["s"].column("_event_id").to_pylist() == ["e0", "e2"]
    assert out.tables["s"].column("ref").to_pylist() == [expected(1)["ref"], expected(3)["ref"]]
    assert out.dead.event_id == ["e1"]
    assert out.dead.reason == ["payload_mismatch"]
    assert out.dead.message == [f"not a canonical fixed_size_binary[16] value: {why}"
                                f"{': ' + repr(text.replace('-', '')) if 'int()' in why else ''}"]
    assert out.dead.raw == [payloads[1]]
