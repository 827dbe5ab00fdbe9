"""Change streams at the door (#42): Debezium events validated as the rows they carry,
with ids from position and key; a missing key passes on to the collector's dead letters;
Kafka tombstones (null values) are ignored and counted, against a real ingestor."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import msgspec
import pytest
from ingest_support import make_config, stored_events
from kafka_frames_support import Batch, RawKafka
from prometheus_client.parser import text_string_to_metric_families
from security_support import ingestor

from icefloe.config import Column, StreamConfig
from icefloe.streams.cdc import POSITION_COLUMN, with_cdc_columns
from icefloe.streams.evolution import EXTRA_FIELD
from icefloe.streams.model import CdcConfig
from ingestor.validate import CompiledStream, InvalidEvents

CUSTOMERS = with_cdc_columns([StreamConfig(
    name="customers", table="inventory.customers", primary_key=("id",),
    columns=(Column("id", "long", required=True), Column("email", "string")),
    cdc=CdcConfig(before_columns=("email",)))], "test")[0]


def change(op: str, key: int | None, email: str | None, lsn: int, *,
           before: str | None = None, wrap: bool = False, **after: object) -> dict:
    row = None if op == "d" else {"id": key, "email": email, **after}
    old = {"id": key, "email": before} if before is not None or op == "d" else None
    if key is None:
        row = {"email": email} if row is not None else None
        old = None
    event = {"before": old, "after": row, "op": op, "ts_ms": 1,
             "source": {"connector": "postgresql", "lsn": lsn, "txId": 7, "ts_ms": 1,
                        "snapshot": "false", "db": "shop", "table": "customers"}}
    return {"schema": {"type": "struct"}, "payload": event} if wrap else event


def body(*events: dict | None) -> bytes:
    return json.dumps(list(events)).encode()


def test_changes_become_rows_with_position_ids_and_before_images():
    stream = CompiledStream(CUSTOMERS)
    canonical = stream.from_json(body(change("c", 1, "a@x", 10),
                                      change("u", 1, "b@x", 11, before="a@x", wrap=True),
                                      change("d", 1, None, 12)))
    rows = [json.loads(p) for p in canonical.payloads]
    assert [r["_cdc_op"] for r in rows] == ["c", "u", "d"]
    assert rows[1]["before_email"] == "a@x"
    assert rows[1]["email"] == "b@x"
    assert rows[2] == {"id": 1, "_cdc_op": "d",
                       POSITION_COLUMN: rows[2][POSITION_COLUMN], "_cdc_deleted": True}
    assert len(set(canonical.body_ids or [])) == 3
    again = stream.from_ndjson(b"\n".join(json.dumps(change("c", 1, "a@x", 10)).encode()
                                          for _ in range(1)))
    assert again.body_ids == canonical.body_ids[:1]  # a re-delivery: the same id


def test_a_change_without_a_key_is_accepted_for_the_dead_letters():
    canonical = CompiledStream(CUSTOMERS).from_events([json.dumps(change("c", None, "a@x",
                                                                         3)).encode()])
    assert "id" not in json.loads(canonical.payloads[0])


@pytest.mark.parametrize(("event", "reason"), [
    (None, "a null change event"),
    ({**change("c", 1, "a", 1), "op": "t"}, "truncate"),
    (change("c", 1, 5, 1), "expected `str | null`, got `int`"),
    ({**change("c", 1, "a", 1), "source": {"connector": "oracle"}}, "no known position"),
    (change("u", 1, "__debezium_unavailable_value", 1), "REPLICA IDENTITY FULL"),
])
def test_changes_that_cannot_apply_refuse_their_request_by_index(event, reason):
    stream = CompiledStream(CUSTOMERS)
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(body(change("c", 2, "ok", 1), event))
    assert info.value.violations[0].index == 1
    assert reason in info.value.violations[0].reason


def test_an_evolving_change_stream_keeps_new_after_fields():
    stream = CompiledStream(msgspec.structs.replace(CUSTOMERS, unknown_fields="evolve"))
    canonical = stream.from_json(body(change("c", 1, "a", 1, city="Oslo")))
    assert json.loads(json.loads(canonical.payloads[0])[EXTRA_FIELD]) == {"city": "Oslo"}


async def test_kafka_tombstones_are_ignored_and_counted(tmp_path: Path):
    config = make_config(tmp_path / "store", (CUSTOMERS,), kafka_port=0)
    async with ingestor(config) as ports:
        assert ports.kafka is not None
        conn = await RawKafka.open(ports.kafka)
        try:
            values = [json.dumps(change("c", 1, "a", 1)).encode(),
                      json.dumps(change("d", 1, None, 2)).encode(), None]
            answer = await conn.produce(9, {"customers": [(0, Batch(values).encode())]})
            assert answer.partition("customers", 0).error == 0
            answer = await conn.produce(9, {"customers": [(0, Batch([None]).encode())]})
            assert answer.partition("customers", 0).error == 0
        finally:
            await conn.close()
        events = [json.loads(e.payload) for e in await stored_events(config.store.url)]
        assert [e["_cdc_op"] for e in events] == ["c", "d"]
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{ports.http}/metrics")).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("icefloe_ingest_cdc_null_values_ignored_total",
                    (("stream", "customers"),))] == 2


async def test_http_takes_wrapped_changes_and_refuses_null_and_truncate(tmp_path: Path):
    config = make_config(tmp_path / "store", (CUSTOMERS,))
    async with ingestor(config) as ports, httpx.AsyncClient() as http:
        url = f"http://127.0.0.1:{ports.http}/v1/streams/customers/events"
        ok = await http.post(url, content=body(change("c", 1, "a", 1, wrap=True),
                                               change("u", 1, "b", 2, before="a")),
                             headers={"content-type": "application/json"})
        assert ok.status_code == 202, ok.text
        for bad, reason in ((body(change("c", 2, "x", 3), None), "a null change event"),
                            (body({**change("c", 2, "x", 3), "op": "t"}), "truncate"),
                            (body(change("u", 1, "__debezium_unavailable_value", 4)),
                             "email holds Debezium's placeholder")):
            refused = await http.post(url, content=bad,
                                      headers={"content-type": "application/json"})
            assert refused.status_code == 400, refused.text
            assert reason in json.dumps(refused.json())
        events = [json.loads(e.payload) for e in await stored_events(config.store.url)]
    assert [(e["_cdc_op"], e.get("before_email")) for e in events] == [("c", None),
                                                                       ("u", "a")]


async def test_kafka_record_errors_name_records_as_sent_around_tombstones(tmp_path: Path):
    """A change stream's batch with tombstones before a change that cannot apply: the
    answer's record error names that change's index in the batch the producer sent (not
    its index among the changes left once the tombstones were dropped), and a refused
    batch stores nothing."""
    config = make_config(tmp_path / "store", (CUSTOMERS,), kafka_port=0)
    async with ingestor(config) as ports:
        assert ports.kafka is not None
        conn = await RawKafka.open(ports.kafka)
        try:
            values = [json.dumps(change("c", 1, "a", 1)).encode(), None, None,
                      json.dumps({**change("c", 2, "b", 2), "op": "t"}).encode()]
            answer = await conn.produce(9, {"customers": [(0, Batch(values).encode())]})
            refused = answer.partition("customers", 0)
            assert refused.error != 0
            assert [index for index, _ in refused.record_errors] == [3]
        finally:
            await conn.close()
        assert await stored_events(config.store.url) == []


@pytest.mark.parametrize(("raw", "code"), [
    (b'{"op":"c","after":{"id":1,"email":"\xff"},"source":{"connector":"postgresql",'
     b'"lsn":1}}', "invalid_utf8"),
    (b'{"op":"c","after":{"id":1,"x":' + b"[" * 1200 + b"]" * 1200 + b'},"source":{}}',
     "json_too_deep"),
])
def test_a_change_not_utf8_or_too_deep_is_refused_with_its_code(raw: bytes, code: str):
    """Not a 500: a change event that is not UTF-8, or nests past the decoder, is refused
    like any other event, by index and with the code a JSON stream gives."""
    stream = CompiledStream(CUSTOMERS)
    for call in (stream.from_events, lambda events: stream.from_json(b"[" + events[0] + b"]")):
        with pytest.raises(InvalidEvents) as info:
            call([raw])
        assert code in (info.value.code, *(v.code for v in info.value.violations))
