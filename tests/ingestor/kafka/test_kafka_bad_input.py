"""Bad input on the Kafka port (issue #40, "Bad input"), against a real ingestor.

Every request here is written by hand over a raw socket (tests/kafka_frames_support.py
builds correct frames and record batches and lets a test break exactly one thing), because
no client sends a bad CRC or a lying record count. Each refusal is checked three ways: the
code the protocol gives a producer (or the closed connection where Kafka closes it), nothing
of the refused batch in the store while the accepted neighbour in the same request is, and
the ingestor still serving the next connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cramjam
import httpx
import msgspec
import pytest
from ingest_support import ORDERS, faulty_local_store, make_config, running_on, stored_events
from kafka_frames_support import (
    API_VERSIONS,
    INIT_PRODUCER_ID,
    PRODUCE,
    Batch,
    RawKafka,
    compress,
    init_producer_id_v3_body,
    message_set_v1,
    produce_body,
    read_api_versions_v0,
    read_init_producer_id_v3,
    read_produce_answer,
    record,
    request_frame,
)
from prometheus_client.parser import text_string_to_metric_families
from security_support import ingestor

from icefloe.config import Column, Config, RateLimit, StreamConfig
from icefloe.store.faults import FaultRule
from icefloe.store.retry import RetryPolicy
from ingestor.kafka.codes import Code
from ingestor.kafka.connection import MAX_IN_FLIGHT
from ingestor.kafka.listener import KafkaServer, start_kafka_server

CLICKS = StreamConfig(name="clicks", table="web.clicks", kafka_partitions=2,
                      columns=(Column("user_id", "string", required=True),
                               Column("n", "long")))
KIB = 1024


def click(user: str, n: int = 0) -> bytes:
    return json.dumps({"user_id": user, "n": n}).encode()


def clicks(prefix: str, count: int) -> list[bytes | None]:
    return [click(f"{prefix}{i}", i) for i in range(count)]


def kafka_config(tmp_path: Path, **ingestor_settings: Any) -> Config:
    return make_config(tmp_path / "store", (CLICKS, ORDERS), kafka_port=0,
                       **ingestor_settings)


@dataclass
class Served:
    kafka: int
    http: int
    url: str

    async def connect(self) -> RawKafka:
        return await RawKafka.open(self.kafka)

    async def users(self) -> list[str]:
        """The user ids of every stored event, in store order."""
        return [json.loads(e.payload)["user_id"] for e in await stored_events(self.url)
                if e.stream == "clicks"]

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{self.http}/metrics")).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    async def still_serving(self) -> None:
        """A fresh connection gets an ApiVersions answer and stores a good batch."""
        conn = await self.connect()
        try:
            await conn.send(API_VERSIONS, 0, b"")
            _, error, apis = read_api_versions_v0(await conn.answer())
            assert error == 0
            assert apis[PRODUCE] == (3, 9)
        finally:
            await conn.close()


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **ingestor_settings: Any) -> AsyncIterator[Served]:
    config = kafka_config(tmp_path, **ingestor_settings)
    async with ingestor(config) as ports:
        assert ports.kafka is not None
        yield Served(ports.kafka, ports.http, config.store.url)


def closed_count(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float],
                 reason: str) -> float:
    return metrics.get(("icefloe_ingest_kafka_closed_total", (("reason", reason),)), 0)


# -- frames ---------------------------------------------------------------------------------

async def test_should_close_on_frames_shorter_than_a_header_and_keep_serving(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "icefloe.ingestor.kafka")
    async with serving(tmp_path) as served:
        for raw in (b"\x00\x00\x00\x04abcd",  # 4 bytes: not even api key + version + id
                    b"\x00\x00\x00\x08\x00\x12\x00\x00\x00\x00\x00\x01",  # no client id
                    b"\xff\xff\xff\xfe"):  # a negative size
            conn = await served.connect()
            await conn.send_raw(raw)
            assert await conn.closed()
            await conn.close()
        await served.still_serving()
        assert closed_count(await served.metrics(), "malformed") == 3
    assert "shorter than a header" in caplog.text
    assert "the request header does not parse" in caplog.text


async def test_should_close_a_size_over_the_limit_before_reading_it(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "icefloe.ingestor.kafka")
    async with serving(tmp_path, kafka_max_request_bytes=64 * KIB) as served:
        conn = await served.connect()
        await conn.send_raw((64 * KIB + 1).to_bytes(4, "big"))  # and no body at all
        assert await conn.closed(5)
        await conn.close()
        big = await served.connect()  # a 2 GiB claim: refused at once, nothing allocated
        await big.send_raw(b"\x7f\xff\xff\xff")
        assert await big.closed(5)
        await big.close()
        await served.still_serving()
        assert closed_count(await served.metrics(), "too_large") == 2
    assert f"over kafka_max_request_bytes ({64 * KIB})" in caplog.text


async def test_should_close_on_garbage_after_a_valid_header(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "icefloe.ingestor.kafka")
    async with serving(tmp_path) as served:
        conn = await served.connect()
        # Produce v7: transactional id claims 0x4142 bytes, then the frame ends
        await conn.send_raw(request_frame(PRODUCE, 7, 1, b"AB\xff\xff"))
        assert await conn.closed()
        await conn.close()
        conn = await served.connect()  # Produce v9 with a topics count of 2**35
        await conn.send_raw(request_frame(PRODUCE, 9, 1, b"\x00\xff\xff\x00\x00\x27\x10"
                                          b"\xff\xff\xff\xff\x7f"))
        assert await conn.closed()
        await conn.close()
        conn = await served.connect()  # a whole Produce, then bytes nothing accounts for
        body = produce_body(9, {"clicks": [(0, Batch(clicks("trailing", 1)).encode())]})
        await conn.send_raw(request_frame(PRODUCE, 9, 1, body + b"\x00\x01"))
        assert await conn.closed()
        await conn.close()
        await served.still_serving()
        assert closed_count(await served.metrics(), "malformed") == 3
        assert await served.users() == []
    assert "Produce v7 does not parse" in caplog.text
    assert "Produce v9 does not parse" in caplog.text
    assert "2 bytes follow the request" in caplog.text


async def test_should_close_on_an_unknown_api_key_and_name_it(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "icefloe.ingestor.kafka")
    async with serving(tmp_path) as served:
        conn = await served.connect()
        await conn.send_raw(request_frame(999, 0, 1, b""))
        assert await conn.closed()
        await conn.close()
        conn = await served.connect()  # a consumer's Fetch: advertised, never served
        await conn.send_raw(request_frame(1, 12, 1, b"\x00" * 40))
        assert await conn.closed()
        await conn.close()
        await served.still_serving()
        assert closed_count(await served.metrics(), "unsupported") == 2
    assert "API key 999 is not served" in caplog.text
    assert "Fetch is not served" in caplog.text
    assert "client id 'raw-test'" in caplog.text


async def test_should_answer_an_apiversions_too_new_with_v0_and_close_produce_v2(tmp_path):
    async with serving(tmp_path) as served:
        conn = await served.connect()
        correlation = await conn.send(API_VERSIONS, 99, b"\x00garbage a v99 may hold")
        got, error, apis = read_api_versions_v0(await conn.answer())
        assert (got, error) == (correlation, Code.UNSUPPORTED_VERSION)
        assert apis[PRODUCE] == (3, 9)
        assert apis[API_VERSIONS] == (0, 3)
        await conn.send(API_VERSIONS, 0, b"")  # the connection stays usable, as Kafka's
        assert read_api_versions_v0(await conn.answer())[1] == 0
        await conn.send(PRODUCE, 2, produce_body(3, {"clicks": [
            (0, Batch(clicks("v2-", 1)).encode())]}))
        assert await conn.closed()
        await conn.close()
        await served.still_serving()
        assert await served.users() == []


# -- record batches -------------------------------------------------------------------------

async def refused_next_to_good(served: Served, bad: bytes, code: Code, *, version: int = 9,
                               tag: str = "ok") -> Any:
    """Produce a good batch to partition 0 and ``bad`` to partition 1 in one request: the
    good one is stored, the bad one answered ``code`` and stored nowhere."""
    conn = await served.connect()
    try:
        answer = await conn.produce(version, {"clicks": [
            (0, Batch(clicks(tag, 2)).encode()), (1, bad)]})
        good, refused = answer.partition("clicks", 0), answer.partition("clicks", 1)
        assert (good.error, refused.error) == (0, code), refused.message
        assert good.base_offset >= 0
        assert refused.base_offset == -1
        await conn.produce(version, {"clicks": [(0, Batch(clicks(tag + "-after", 1))
                                                 .encode())]})  # the connection serves on
    finally:
        await conn.close()
    users = await served.users()
    assert [u for u in users if u.startswith(tag)] == [f"{tag}0", f"{tag}1", f"{tag}-after0"]
    assert not [u for u in users if u.startswith("bad")]
    return refused


async def test_should_refuse_a_bad_crc_as_corrupt_message_and_store_nothing(tmp_path):
    async with serving(tmp_path) as served:
        good = Batch(clicks("bad", 2)).encode()
        flipped = bytearray(good)
        flipped[-5] ^= 0x01  # one bit of the last record's value
        refused = await refused_next_to_good(served, bytes(flipped), Code.CORRUPT_MESSAGE)
        assert "CRC32C does not match" in refused.message
        batch = Batch(clicks("bad", 1))  # the CRC field itself wrong
        await refused_next_to_good(served, batch.encode(crc=0xDEADBEEF),
                                   Code.CORRUPT_MESSAGE, tag="crc", version=8)
        await served.still_serving()


async def test_should_refuse_an_old_message_format(tmp_path):
    async with serving(tmp_path) as served:
        # a short one (under a v2 header's 61 bytes) and a long one
        for value in (b'{"user_id":"bad"}', click("bad-v1-long" + "x" * 80)):
            refused = await refused_next_to_good(served, message_set_v1(value),
                                                 Code.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                                                 tag=f"v1-{len(value)}-")
            assert "magic 1" in refused.message
        refused = await refused_next_to_good(served, Batch(clicks("bad", 2), magic=3).encode(),
                                             Code.UNSUPPORTED_FOR_MESSAGE_FORMAT, tag="m3-")
        assert "magic 3" in refused.message


async def test_should_refuse_batches_that_lie_about_their_records(tmp_path):
    async with serving(tmp_path) as served:
        lies = [
            (Batch(clicks("bad", 2), count=3), Code.CORRUPT_MESSAGE, "do not parse"),
            (Batch(clicks("bad", 2), count=1), Code.CORRUPT_MESSAGE, "follow"),
            (Batch(clicks("bad", 2), last_offset_delta=5), Code.INVALID_RECORD, "must agree"),
            (Batch(clicks("bad", 2), count=0, last_offset_delta=-1), Code.INVALID_RECORD,
             "0 records"),
            (Batch(clicks("bad", 2), offset_deltas=[0, 0]), Code.CORRUPT_MESSAGE,
             "offset delta"),
            (Batch(clicks("bad", 2), codec="gzip", offset_deltas=[0, 7]),
             Code.CORRUPT_MESSAGE, "offset delta"),
            (Batch(clicks("bad", 1), records_bytes=Batch(clicks("bad", 1)).records()[:-3]),
             Code.CORRUPT_MESSAGE, "record 0"),
            (Batch(clicks("bad", 1), codec="zstd", compressed=b"\x28\xb5\x2f\xfd garbage"),
             Code.CORRUPT_MESSAGE, "does not decompress"),
        ]
        for index, (batch, code, why) in enumerate(lies):
            refused = await refused_next_to_good(served, batch.encode(), code, tag=f"lie{index}-")
            assert why in refused.message, (index, refused.message)
        truncated = Batch(clicks("bad", 2)).encode()[:-4]  # says more bytes than arrived
        refused = await refused_next_to_good(served, truncated, Code.CORRUPT_MESSAGE, tag="tr")
        assert "arrived" in refused.message
        await served.still_serving()


async def test_should_refuse_two_batches_in_one_partition(tmp_path):
    async with serving(tmp_path) as served:
        two = Batch(clicks("bad-a", 1)).encode() + Batch(clicks("bad-b", 1)).encode()
        refused = await refused_next_to_good(served, two, Code.INVALID_RECORD)
        assert "more than one record batch" in refused.message


def xerial(raw: bytes) -> bytes:
    """Snappy in the Java client's xerial framing: magic, versions, then sized blocks."""
    block = bytes(cramjam.snappy.compress_raw(raw))
    return b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") + (1).to_bytes(4, "big") + \
        len(block).to_bytes(4, "big") + block


@pytest.mark.parametrize(("codec", "inflated"), [
    ("gzip", 16 << 20), ("zstd", 32 << 20), ("lz4", 8 << 20), ("snappy", 1 << 20),
    ("xerial", 1 << 20)])
async def test_should_refuse_a_compression_bomb_without_inflating_it(tmp_path, codec, inflated):
    limit = 64 * KIB
    raw = record(0, b"a" * inflated)
    if codec == "xerial":
        bomb = Batch([None], codec="snappy", compressed=xerial(raw))
    else:
        bomb = Batch([None], codec=codec, compressed=compress(raw, codec))
    del raw
    data = bomb.encode()
    assert len(data) < limit - 100, len(data)  # the frame itself is within the limit
    async with serving(tmp_path, kafka_max_request_bytes=limit) as served:
        await served.still_serving()
        tracemalloc.start()
        try:
            refused = await refused_next_to_good(served, data, Code.MESSAGE_TOO_LARGE)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert f"decompresses to more than {limit} bytes" in refused.message
        assert peak < min(inflated // 2, 2 << 20), f"{peak} bytes allocated at the peak"


async def test_should_refuse_a_tombstone_with_record_errors(tmp_path):
    async with serving(tmp_path) as served:
        batch = Batch([click("bad0"), None, click("bad2"), None]).encode()
        refused = await refused_next_to_good(served, batch, Code.INVALID_RECORD)
        assert refused.record_errors == [(1, "null value"), (3, "null value")]
        assert "2 record(s) have a null value" in refused.message
        refused = await refused_next_to_good(served, batch, Code.INVALID_RECORD, version=8,
                                             tag="v8-")
        assert refused.record_errors == [(1, "null value"), (3, "null value")]
        await refused_next_to_good(served, batch, Code.INVALID_RECORD, version=7, tag="v7-")


async def test_should_refuse_control_and_transactional_batches(tmp_path):
    async with serving(tmp_path) as served:
        control = Batch(clicks("bad", 1), producer_id=9, epoch=0, base_sequence=0,
                        attributes=0x20 | 0x10)
        refused = await refused_next_to_good(served, control.encode(), Code.INVALID_RECORD)
        assert "control batch" in refused.message
        txn = Batch(clicks("bad", 2), producer_id=9, epoch=0, base_sequence=0,
                    attributes=0x10)
        refused = await refused_next_to_good(served, txn.encode(), Code.INVALID_RECORD,
                                             tag="txn")
        assert "transactional batch" in refused.message
        conn = await served.connect()
        answer = await conn.produce(9, {"clicks": [(0, Batch(clicks("bad-id", 1)).encode())]},
                                    transactional_id="tx-1")
        assert answer.partition("clicks", 0).error == Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        await conn.close()
        assert not [u for u in await served.users() if u.startswith("bad")]


async def test_should_refuse_acks_other_than_0_1_all(tmp_path):
    async with serving(tmp_path) as served:
        conn = await served.connect()
        for acks in (2, -2, 7):
            answer = await conn.produce(9, {"clicks": [
                (0, Batch(clicks("bad", 1)).encode()), (1, Batch(clicks("bad", 1)).encode())]},
                acks=acks)
            assert [p.error for p in answer.topics["clicks"]] == \
                [Code.INVALID_REQUIRED_ACKS] * 2
            assert f"acks={acks}" in (answer.partition("clicks", 1).message or "")
        for acks in (1, -1):
            answer = await conn.produce(9, {"clicks": [
                (0, Batch(clicks(f"acks{acks}-", 1)).encode())]}, acks=acks)
            assert answer.partition("clicks", 0).error == 0
        await conn.close()
        assert sorted(await served.users()) == ["acks-1-0", "acks1-0"]


async def test_should_store_acks_0_without_answering(tmp_path, caplog):
    """acks=0: no answer at all, by protocol. What it promises: nothing the client can see
    about durability. The ingestor does what it does for acks=1 (checks, buffers, makes
    durable before it reads past the read-ahead bound); a refused acks=0 batch closes the
    connection, as Kafka's broker does, since no answer can carry its error."""
    caplog.set_level(logging.WARNING, "icefloe.ingestor.kafka")
    async with serving(tmp_path) as served:
        conn = await served.connect()
        await conn.send(PRODUCE, 9, produce_body(9, {"clicks": [
            (0, Batch(clicks("zero", 3)).encode())]}, acks=0))
        correlation = await conn.send(API_VERSIONS, 0, b"")
        got, error, _ = read_api_versions_v0(await conn.answer())
        assert (got, error) == (correlation, 0)  # the first answer: no Produce answer
        # answers go out in request order, so the acks=0 batch is durable by now
        assert await served.users() == ["zero0", "zero1", "zero2"]
        await conn.send(PRODUCE, 9, produce_body(9, {"clicks": [
            (1, Batch([click("bad"), None]).encode())]}, acks=0))  # refused: a tombstone
        await conn.send(API_VERSIONS, 0, b"")  # never answered: the connection closes
        assert await conn.closed()
        await conn.close()
        await served.still_serving()
        assert await served.users() == ["zero0", "zero1", "zero2"]
        metrics = await served.metrics()
        assert closed_count(metrics, "acks0_refused") == 1
        assert metrics[("icefloe_ingest_events_rejected_total",
                        (("reason", "invalid_record"), ("stream", "clicks")))] == 1
    assert "an acks=0 Produce to clicks[1] was refused (INVALID_RECORD" in caplog.text


async def test_should_refuse_partitions_and_topics_that_do_not_exist(tmp_path):
    async with serving(tmp_path) as served:
        conn = await served.connect()
        answer = await conn.produce(9, {
            "clicks": [(0, Batch(clicks("ok", 1)).encode()), (2, Batch(clicks("bad", 1))
                                                              .encode()),
                       (-1, Batch(clicks("bad", 1)).encode())],
            "nope": [(0, Batch(clicks("bad", 1)).encode())]})
        assert [p.error for p in answer.topics["clicks"]] == \
            [0, Code.UNKNOWN_TOPIC_OR_PARTITION, Code.UNKNOWN_TOPIC_OR_PARTITION]
        assert "partitions 0-1 (kafka_partitions); not 2" in \
            (answer.partition("clicks", 2).message or "")
        assert answer.partition("nope", 0).error == Code.UNKNOWN_TOPIC_OR_PARTITION
        await conn.close()
        assert await served.users() == ["ok0"]


# -- idempotent producers -------------------------------------------------------------------

def idem(prefix: str, count: int, sequence: int, *, pid: int = 4242, epoch: int = 0
         ) -> bytes:
    return Batch(clicks(prefix, count), producer_id=pid, epoch=epoch,
                 base_sequence=sequence).encode()


async def test_should_refuse_a_sequence_gap_on_one_connection(tmp_path):
    async with serving(tmp_path) as served:
        conn = await served.connect()
        first = await conn.produce(9, {"clicks": [(0, idem("seq-a", 2, 0))]})
        assert first.partition("clicks", 0).error == 0
        gap = await conn.produce(9, {"clicks": [(0, idem("bad", 2, 5)),
                                                (1, idem("other-p", 1, 0))]})
        refused = gap.partition("clicks", 0)
        assert refused.error == Code.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert "sequence 5 follows 1: 3 sequence(s) missing" in (refused.message or "")
        assert gap.partition("clicks", 1).error == 0  # another partition: its own sequence
        after = await conn.produce(9, {"clicks": [(0, idem("seq-b", 1, 2))]})
        assert after.partition("clicks", 0).error == 0
        await conn.close()
        other = await served.connect()  # per connection only: a new one takes the gap
        later = await other.produce(9, {"clicks": [(0, idem("seq-c", 1, 9))]})
        assert later.partition("clicks", 0).error == 0
        await other.close()
        assert sorted(await served.users()) == ["other-p0", "seq-a0", "seq-a1", "seq-b0",
                                                "seq-c0"]


async def test_should_answer_a_duplicate_of_a_durable_batch_with_its_first_offset(tmp_path):
    async with serving(tmp_path) as served:
        conn = await served.connect()
        batch = idem("dup", 3, 0)
        first = (await conn.produce(9, {"clicks": [(1, batch)]})).partition("clicks", 1)
        again = (await conn.produce(9, {"clicks": [(1, batch)]})).partition("clicks", 1)
        assert (first.error, again.error) == (0, 0)
        assert again.base_offset == first.base_offset >= 0
        await conn.close()
        other = await served.connect()  # the cache is the ingestor's, not the connection's
        third = (await other.produce(8, {"clicks": [(1, batch)]})).partition("clicks", 1)
        assert (third.error, third.base_offset) == (0, first.base_offset)
        await other.close()
        assert await served.users() == ["dup0", "dup1", "dup2"]  # stored once


async def test_should_bump_an_epoch_asked_for_and_warn_that_renumbered_records_may_repeat(
        tmp_path, caplog):
    """A client that bumps its own epoch (KIP-360; librdkafka after records timed out) gets
    it, and the operator hears why that may store a record twice: the records it renumbers
    under the new epoch get new event ids."""
    caplog.set_level(logging.WARNING, "icefloe.ingestor.kafka")
    async with serving(tmp_path) as served:
        conn = await served.connect()
        await conn.send(INIT_PRODUCER_ID, 3, init_producer_id_v3_body())
        error, producer_id, epoch = read_init_producer_id_v3(await conn.answer())
        assert (error, epoch) == (0, 0)
        assert producer_id >= 0
        assert "bumped its epoch" not in caplog.text  # a new producer is no bump
        await conn.send(INIT_PRODUCER_ID, 3, init_producer_id_v3_body(producer_id, 0))
        assert read_init_producer_id_v3(await conn.answer()) == (0, producer_id, 1)
        await conn.close()
        metrics = await served.metrics()
    assert metrics[("icefloe_ingest_kafka_epoch_bumps_total", ())] == 1
    assert f"Kafka producer {producer_id} bumped its epoch 0 -> 1" in caplog.text
    assert "message.timeout.ms" in caplog.text


async def test_should_refuse_an_older_epoch_on_one_connection(tmp_path):
    async with serving(tmp_path) as served:
        conn = await served.connect()
        newer = await conn.produce(9, {"clicks": [(0, idem("epoch1-", 1, 0, epoch=1))]})
        assert newer.partition("clicks", 0).error == 0
        older = await conn.produce(9, {"clicks": [(0, idem("bad", 1, 1, epoch=0))]})
        refused = older.partition("clicks", 0)
        assert refused.error == Code.INVALID_PRODUCER_EPOCH
        assert "producer epoch 0 is older than 1" in (refused.message or "")
        bumped = await conn.produce(9, {"clicks": [(0, idem("epoch2-", 1, 0, epoch=2))]})
        assert bumped.partition("clicks", 0).error == 0  # a newer epoch restarts sequences
        await conn.close()
        assert await served.users() == ["epoch1-0", "epoch2-0"]


# -- memory: read-ahead, partial frames, connections, idleness ------------------------------

@contextlib.asynccontextmanager
async def listener_on(config: Config, store: Any) -> AsyncIterator[KafkaServer]:
    """A runtime on ``store`` (one that injects faults) and its Kafka listener."""
    async with running_on(config, store, probe=False) as runtime:
        server = await start_kafka_server(runtime, "127.0.0.1", 0, tls=None)
        try:
            yield server
        finally:
            await server.stop()


def gated_store(tmp_path: Path) -> tuple[Any, asyncio.Event]:
    """A store whose batch writes wait for the returned event: nothing becomes durable, so
    no Produce can be answered, until the test says so."""
    gate = asyncio.Event()

    async def opened() -> None:
        await gate.wait()

    store, _ = faulty_local_store(tmp_path / "store", [FaultRule(
        "delay", ops=frozenset({"put"}), key_prefix="batches/", times=None, delay_s=(0, 0),
        on_fire=opened)])
    return store, gate


async def test_should_stop_reading_a_pipelining_client_after_max_in_flight(tmp_path):
    store, gate = gated_store(tmp_path)
    async with listener_on(kafka_config(tmp_path), store) as server:
        real, seen = server.front.produce, []

        async def counting(request: Any, producer: Any) -> Any:
            seen.append(request)
            return await real(request, producer)

        server.front.produce = counting  # type: ignore[method-assign]
        conn = await RawKafka.open(server.port)
        conn.writer.write(b"".join(  # 100 requests, ~20 KB: all sent before any answer
            request_frame(PRODUCE, 9, i, produce_body(9, {"clicks": [
                (i % 2, Batch(clicks(f"p{i}-", 1)).encode())]})) for i in range(100)))
        await conn.writer.drain()
        async with asyncio.timeout(10):
            while len(seen) < MAX_IN_FLIGHT:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # proving a negative: nothing more is read meanwhile
        assert len(seen) == MAX_IN_FLIGHT
        gate.set()
        got = [read_produce_answer(await conn.answer(), 9) for _ in range(100)]
        assert [a.correlation for a in got] == list(range(100))  # in request order
        assert all(a.partition("clicks", i % 2).error == 0 for i, a in enumerate(got))
        await conn.close()
    users = [json.loads(e.payload)["user_id"] for e in await stored_events(store.url)]
    assert sorted(users) == sorted(f"p{i}-0" for i in range(100))


async def test_should_close_partial_frames_after_the_body_timeout(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "icefloe.ingestor.kafka")
    async with serving(tmp_path, kafka_max_request_bytes=64 * KIB, body_timeout_s=0.5) \
            as served:
        conns = [await served.connect() for _ in range(50)]
        for conn in conns:  # a 60 KiB frame announced, 1 KiB of it sent, then silence
            await conn.send_raw((60 * KIB).to_bytes(4, "big") + b"\x00" * KIB)
        assert all(await asyncio.gather(*(conn.closed(10) for conn in conns)))
        for conn in conns:
            await conn.close()
        await served.still_serving()
        metrics = await served.metrics()
        assert closed_count(metrics, "slow") == 50
        assert metrics[("icefloe_ingest_kafka_connections", ())] == 0
    assert f"a {60 * KIB}-byte request did not arrive within 0.5 s" in caplog.text


async def test_should_refuse_connections_over_the_limit(tmp_path):
    async with serving(tmp_path, kafka_max_connections=3) as served:
        held = [await served.connect() for _ in range(3)]
        for conn in held:  # each one is being served (so counted)
            await conn.send(API_VERSIONS, 0, b"")
            assert read_api_versions_v0(await conn.answer())[1] == 0
        extra = await served.connect()
        assert await extra.closed(5)
        await extra.close()
        metrics = await served.metrics()
        assert closed_count(metrics, "too_many_connections") == 1
        assert metrics[("icefloe_ingest_kafka_connections", ())] == 3
        await held.pop().close()
        async with asyncio.timeout(10):  # the freed place is taken again
            while (await served.metrics())[("icefloe_ingest_kafka_connections", ())] > 2:
                await asyncio.sleep(0.02)
        await served.still_serving()
        for conn in held:
            await conn.close()


async def test_should_close_an_idle_connection(tmp_path):
    async with serving(tmp_path, kafka_idle_s=1.0) as served:
        idle, busy = await served.connect(), await served.connect()
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(8):  # a client that speaks every 0.2 s is kept, past kafka_idle_s
            await busy.send(API_VERSIONS, 0, b"")
            assert read_api_versions_v0(await busy.answer())[1] == 0
            await asyncio.sleep(0.2)
        assert await idle.closed(5)
        assert loop.time() - started >= 1.0
        assert not await busy.closed(0.05)
        await idle.close()
        await busy.close()
        assert closed_count(await served.metrics(), "idle") == 1


# -- the store down, rate limits ------------------------------------------------------------

async def test_should_answer_not_enough_replicas_while_the_store_is_down(tmp_path):
    store, faulty = faulty_local_store(tmp_path / "store", [FaultRule(
        "fail", ops=frozenset({"put"}), key_prefix="batches/", times=None)],
        RetryPolicy(max_attempts=1))
    async with listener_on(kafka_config(tmp_path, retry_after_s=2), store) as server:
        conn = await RawKafka.open(server.port)
        batch = idem("down", 2, 0)
        down = await conn.produce(9, {"clicks": [(0, batch)]})
        refused = down.partition("clicks", 0)
        assert refused.error == Code.NOT_ENOUGH_REPLICAS  # retriable: the client retries
        assert "object store is unavailable" in (refused.message or "")
        assert down.throttle_ms == 2000  # retry_after_s
        assert faulty.injected["fail"] >= 1
        faulty.rules.clear()  # the store is back
        back = await conn.produce(9, {"clicks": [(0, batch)]})  # the producer's retry
        assert (back.partition("clicks", 0).error, back.throttle_ms) == (0, 0)
        await conn.close()
    users = [json.loads(e.payload)["user_id"] for e in await stored_events(store.url)]
    assert users == ["down0", "down1"]


async def test_should_answer_request_timed_out_when_a_flush_may_still_land(tmp_path):
    """A flush that outlives ``flush_timeout_s`` goes on writing: its records may still be
    stored. Kafka's answer for that is REQUEST_TIMED_OUT ("possibly persisted" to
    librdkafka), not NOT_ENOUGH_REPLICAS ("nothing was written"); the retry, with the same
    sequences, is stored again under the same event ids, which the collector's dedup
    drops."""
    store, faulty = faulty_local_store(tmp_path / "store", [FaultRule(
        "delay", ops=frozenset({"put"}), key_prefix="manifest", times=1, delay_s=(1.5, 1.5))])
    async with listener_on(kafka_config(tmp_path, flush_timeout_s=0.5), store) as server:
        conn = await RawKafka.open(server.port)
        batch = idem("late", 2, 0)
        late = await conn.produce(9, {"clicks": [(0, batch)]})
        refused = late.partition("clicks", 0)
        assert refused.error == Code.REQUEST_TIMED_OUT
        assert "took longer than 0.5s" in (refused.message or "")
        assert faulty.injected["delay"] == 1
        deadline = asyncio.get_running_loop().time() + 10
        while not await stored_events(store.url):  # the timed-out write lands after all
            assert asyncio.get_running_loop().time() < deadline, "the late write never landed"
            await asyncio.sleep(0.05)
        retried = await conn.produce(9, {"clicks": [(0, batch)]})  # the producer's retry
        assert retried.partition("clicks", 0).error == 0
        await conn.close()
    stored = [e for e in await stored_events(store.url) if e.stream == "clicks"]
    assert [json.loads(e.payload)["user_id"] for e in stored] == ["late0", "late1"] * 2
    assert len({e.event_id for e in stored}) == 2  # the same two ids: dedup drops the copy


@contextlib.asynccontextmanager
async def rate_limited(tmp_path: Path) -> AsyncIterator[Served]:
    """An ingestor whose ``clicks`` takes 10 events/s with a half-second burst (5)."""
    limited = msgspec.structs.replace(CLICKS, rate_limit=RateLimit(events_per_s=10,
                                                                   burst_s=0.5))
    config = make_config(tmp_path / "store", (limited,), kafka_port=0)
    async with ingestor(config) as ports:
        assert ports.kafka is not None
        yield Served(ports.kafka, ports.http, config.store.url)


async def test_should_throttle_within_the_timeout_then_time_out(tmp_path):
    async with rate_limited(tmp_path) as served:
        conn = await served.connect()
        loop = asyncio.get_running_loop()
        started = loop.time()
        # one request: partition 0 empties the bucket (5 events), partition 1 waits for 3
        # (Produce v5: a client that does not wait throttle_time_ms itself is told how
        # long the answer was held, as a broker tells it)
        waited = await conn.produce(5, {"clicks": [(0, Batch(clicks("burst", 5)).encode()),
                                                   (1, Batch(clicks("wait", 3)).encode())]},
                                    timeout_ms=5000)
        took = loop.time() - started
        assert [p.error for p in waited.topics["clicks"]] == [0, 0]
        assert 150 <= waited.throttle_ms <= 1000  # ~0.3 s: 3 events at 10/s
        assert took >= waited.throttle_ms / 1000 * 0.9  # the answer waited that long
        # Produce v6+ (KIP-219): the client waits throttle_time_ms itself, so an answer
        # already held for the limit reports none (it would wait twice)
        started = loop.time()
        held = await conn.produce(9, {"clicks": [(0, Batch(clicks("held", 3)).encode())]},
                                  timeout_ms=5000)
        assert held.partition("clicks", 0).error == 0
        assert loop.time() - started >= 0.15  # the answer was held...
        assert held.throttle_ms == 0  # ... and is not reported again
        # partition 0 empties the bucket if it is full again (else it times out itself);
        # either way partition 1 needs a full bucket (5 events, 0.5 s) and has 50 ms
        late = await conn.produce(9, {"clicks": [(0, Batch(clicks("late", 5)).encode()),
                                                 (1, Batch(clicks("bad", 5)).encode())]},
                                  timeout_ms=50)
        refused = late.partition("clicks", 1)
        assert refused.error == Code.REQUEST_TIMED_OUT  # retriable
        assert "over its rate limit" in (refused.message or "")
        assert late.throttle_ms > 0
        first = late.partition("clicks", 0).error
        assert first in (0, Code.REQUEST_TIMED_OUT)
        await conn.close()
        assert sorted(await served.users()) == [f"burst{i}" for i in range(5)] + \
            [f"held{i}" for i in range(3)] + \
            ([f"late{i}" for i in range(5)] if first == 0 else []) + \
            [f"wait{i}" for i in range(3)]
        metrics = await served.metrics()
    requests = {labels: value for (name, labels), value in metrics.items()
                if name == "icefloe_ingest_requests_total"
                and ("transport", "kafka") in labels}
    assert requests == {  # per partition batch
        (("status", "NONE"), ("stream", "clicks"), ("transport", "kafka")): 4 if first == 0
        else 3,
        (("status", "REQUEST_TIMED_OUT"), ("stream", "clicks"), ("transport", "kafka")):
        1 if first == 0 else 2}


async def test_should_keep_a_pipelined_producers_sequences_in_order_under_a_rate_limit(
        tmp_path):
    """Three pipelined Produce requests of one idempotent producer on one connection, the
    second held by the stream's rate limit: the third (which needs room for fewer events)
    waits behind it instead of overtaking it and being refused OUT_OF_ORDER_SEQUENCE_NUMBER,
    and the records are stored in sequence order, as a Kafka partition keeps them."""
    async with rate_limited(tmp_path) as served:
        conn = await served.connect()
        sent = [await conn.send(PRODUCE, 9, produce_body(9, {"clicks": [(0, body)]},
                                                         timeout_ms=5000))
                for body in (idem("p", 5, 0), idem("a", 3, 5), idem("b", 1, 8))]
        answers = [read_produce_answer(await conn.answer(), 9) for _ in sent]
        assert [a.correlation for a in answers] == sent
        parts = [a.partition("clicks", 0) for a in answers]
        assert [(p.error, p.message) for p in parts] == [(0, None)] * 3
        assert [p.base_offset for p in parts] == sorted(p.base_offset for p in parts)
        await conn.close()
        assert await served.users() == [f"p{i}" for i in range(5)] + \
            [f"a{i}" for i in range(3)] + ["b0"]


async def test_should_release_a_connection_whose_acks_0_produce_was_refused_mid_pipeline(
        tmp_path):
    """A refused acks=0 Produce closes the connection while more requests than the
    read-ahead bound are already buffered behind it: the connection ends (its count goes
    back to zero) instead of waiting forever for answer slots nobody frees."""
    async with serving(tmp_path) as served:
        conn = await served.connect()
        refused = request_frame(PRODUCE, 9, 1, produce_body(9, {"clicks": [
            (1, Batch([click("bad"), None]).encode())]}, acks=0))
        behind = b"".join(request_frame(PRODUCE, 9, 2 + i, produce_body(9, {"clicks": [
            (0, Batch([click(f"behind{i}")]).encode())]}, acks=0))
            for i in range(MAX_IN_FLIGHT * 3))
        await conn.send_raw(refused + behind)
        assert await conn.closed()
        await conn.close()
        key = ("icefloe_ingest_kafka_connections", ())
        async with asyncio.timeout(10):
            while (await served.metrics()).get(key) != 0:
                await asyncio.sleep(0.05)
        await served.still_serving()
        metrics = await served.metrics()
        assert closed_count(metrics, "acks0_refused") == 1

