"""Auth on the Kafka port (issue #40, "Auth and limits"): SASL/PLAIN over TLS with icefloe's
stream tokens, driven by two independent clients (confluent-kafka, i.e. librdkafka, and
kafka-python) and by hand for the exact frames; the plaintext-only-on-loopback rule; the
metrics an operator watches.

The clients are blocking, the ingestor runs in this loop: every client call goes through
``asyncio.to_thread`` so the loop keeps serving it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import httpx
import msgspec
import pytest
from ingest_support import ORDERS, TOKEN, make_config, stored_events
from kafka_frames_support import (
    API_VERSIONS,
    PRODUCE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    Batch,
    RawKafka,
    read_api_versions_v0,
)
from prometheus_client.parser import text_string_to_metric_families
from security_support import Authority, ingestor

from icefloe.config import Column, Config, StreamConfig
from icefloe.errors import ConfigError
from icefloe.tokens import hash_token
from ingestor.kafka.codes import Code
from ingestor.kafka.wire import Reader, Writer

CLICKS = StreamConfig(name="clicks", table="web.clicks",
                      columns=(Column("user_id", "string", required=True),))
"""An open stream (no tokens) next to ``orders`` (TOKEN)."""


def order(order_id: str) -> bytes:
    return json.dumps({"order_id": order_id, "amount": 1.5}).encode()


@dataclass
class Secured:
    kafka: int
    http: int
    url: str
    ca_file: Path

    def client(self, **settings: Any) -> dict[str, Any]:
        """confluent-kafka settings for this ingestor over TLS (``settings`` added)."""
        return {"bootstrap.servers": f"127.0.0.1:{self.kafka}", "security.protocol": "SSL",
                "ssl.ca.location": str(self.ca_file), "message.timeout.ms": 8000,
                "linger.ms": 5, **settings}

    async def stored(self) -> dict[str, list[bytes]]:
        out: dict[str, list[bytes]] = {}
        for envelope in await stored_events(self.url):
            out.setdefault(envelope.stream, []).append(envelope.payload)
        return out

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        async with httpx.AsyncClient(verify=context) as http:
            text = (await http.get(f"https://127.0.0.1:{self.http}/metrics")).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    async def raw(self) -> RawKafka:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return await RawKafka.open(self.kafka, ssl=context, server_hostname="127.0.0.1")


def tls_config(tmp_path: Path) -> tuple[Config, Path]:
    authority = Authority.create(tmp_path, "kafka")
    cert, key = authority.write("localhost", server=True)
    config = make_config(tmp_path / "store", (CLICKS, ORDERS), kafka_port=0,
                         tls_cert_file=str(cert), tls_key_file=str(key))
    return config, authority.ca_file


@contextlib.asynccontextmanager
async def secured(tmp_path: Path) -> AsyncIterator[Secured]:
    config, ca_file = tls_config(tmp_path)
    async with ingestor(config) as ports:
        assert ports.kafka is not None
        yield Secured(ports.kafka, ports.http, config.store.url, ca_file)


@dataclass
class Outcome:
    """What a confluent-kafka producer saw: delivery reports and client-level errors."""

    delivered: list[tuple[str, int]] = field(default_factory=list)
    failed: list[tuple[str, confluent_kafka.KafkaError]] = field(default_factory=list)
    errors: list[confluent_kafka.KafkaError] = field(default_factory=list)
    left: int = 0


def produce(settings: dict[str, Any], messages: list[tuple[str, bytes]],
            flush_s: float = 15) -> Outcome:
    """Produce ``messages`` (topic, value) with confluent-kafka and flush (blocking)."""
    outcome = Outcome()

    def report(error: confluent_kafka.KafkaError | None, message: Any) -> None:
        if error is None:
            outcome.delivered.append((message.topic(), message.offset()))
        else:
            outcome.failed.append((message.topic(), error))

    producer = confluent_kafka.Producer({**settings, "error_cb": outcome.errors.append})
    for topic, value in messages:
        producer.produce(topic, value, on_delivery=report)
    outcome.left = producer.flush(flush_s)
    return outcome


def plain(token: str) -> dict[str, Any]:
    return {"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN",
            "sasl.username": "any-name", "sasl.password": token}


# -- confluent-kafka ------------------------------------------------------------------------

async def test_should_take_sasl_plain_over_tls_with_a_stream_token(tmp_path):
    async with secured(tmp_path) as served:
        outcome = await asyncio.to_thread(produce, served.client(
            **plain(TOKEN), **{"enable.idempotence": True}),
            [("orders", order(f"o{i}")) for i in range(5)] + [("clicks", b'{"user_id":"c"}')])
        assert (outcome.left, outcome.failed) == (0, [])
        assert len(outcome.delivered) == 6
        stored = await served.stored()
        assert sorted(json.loads(p)["order_id"] for p in stored["orders"]) == \
            [f"o{i}" for i in range(5)]
        assert len(stored["clicks"]) == 1
        metrics = await served.metrics()
    assert metrics[("icefloe_ingest_requests_total", (("status", "NONE"), ("stream", "orders"),
                                                      ("transport", "kafka")))] >= 1
    assert metrics[("icefloe_ingest_events_accepted_total", (("stream", "orders"),))] == 5


async def test_should_refuse_a_wrong_token_and_close(tmp_path):
    async with secured(tmp_path) as served:
        outcome = await asyncio.to_thread(produce, served.client(
            **plain("not-the-token"), **{"message.timeout.ms": 3000}),
            [("orders", order("never"))], 8)
        assert outcome.delivered == []
        auth = [e for e in outcome.errors
                if e.code() == confluent_kafka.KafkaError._AUTHENTICATION]
        assert auth, outcome.errors
        assert "not a valid icefloe stream token" in auth[0].str()
        assert "orders" not in await served.stored()
        metrics = await served.metrics()
        assert metrics[("icefloe_ingest_kafka_closed_total", (("reason", "sasl"),))] >= 1


async def test_should_refuse_a_tokened_stream_without_sasl_and_serve_an_open_one(tmp_path):
    async with secured(tmp_path) as served:
        outcome = await asyncio.to_thread(produce, served.client(),
                                          [("orders", order("anon")),
                                           ("clicks", b'{"user_id":"anon"}')])
        assert outcome.left == 0
        assert [(t, e.code()) for t, e in outcome.failed] == [
            ("orders", confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED)]
        assert [t for t, _ in outcome.delivered] == ["clicks"]
        stored = await served.stored()
        assert "orders" not in stored
        assert [json.loads(p)["user_id"] for p in stored["clicks"]] == ["anon"]
        metrics = await served.metrics()
    assert metrics[("icefloe_ingest_requests_total", (
        ("status", "TOPIC_AUTHORIZATION_FAILED"), ("stream", "orders"),
        ("transport", "kafka")))] >= 1


async def test_should_refuse_scram_as_an_unsupported_mechanism(tmp_path):
    async with secured(tmp_path) as served:
        outcome = await asyncio.to_thread(produce, served.client(
            **{**plain(TOKEN), "sasl.mechanisms": "SCRAM-SHA-256",
               "message.timeout.ms": 3000}), [("orders", order("scram"))], 8)
        assert outcome.delivered == []
        said = " ".join(e.str() for e in outcome.errors)
        assert "SCRAM-SHA-256" in said, said
        assert "PLAIN" in said  # what the ingestor offers instead
        assert "orders" not in await served.stored()


# -- kafka-python ---------------------------------------------------------------------------

def kafka_python_send(served: Secured, token: str, values: list[bytes]) -> list[int]:
    """Send with kafka-python over SASL_SSL PLAIN; the offsets (blocking)."""
    from kafka import KafkaProducer  # why: the second client, only for this test

    producer = KafkaProducer(
        bootstrap_servers=f"127.0.0.1:{served.kafka}", security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN", sasl_plain_username="any-name", sasl_plain_password=token,
        ssl_cafile=str(served.ca_file), request_timeout_ms=10_000, max_block_ms=10_000,
        bootstrap_timeout_ms=3000)
    try:
        futures = [producer.send("orders", value) for value in values]
        return [future.get(timeout=15).offset for future in futures]
    finally:
        producer.close(5)


async def test_should_take_sasl_plain_from_kafka_python(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    async with secured(tmp_path) as served:
        offsets = await asyncio.to_thread(kafka_python_send, served, TOKEN,
                                          [order("kp1"), order("kp2")])
        assert offsets == sorted(offsets)
        assert len(set(offsets)) == 2
        stored = await served.stored()
        assert sorted(json.loads(p)["order_id"] for p in stored["orders"]) == ["kp1", "kp2"]
        from kafka.errors import KafkaError  # why: the second client, only for this test
        with pytest.raises(KafkaError):
            await asyncio.to_thread(kafka_python_send, served, "wrong", [order("never")])
        # kafka-python gives up bootstrapping (KafkaTimeoutError); what its own log says
        # depends on whether it read the refusal or the close first (a loaded machine), so
        # the proof is the ingestor's side: each attempt refused and closed, nothing stored
        refusals = [r for r in caplog.records if r.name == "icefloe.ingestor.kafka"
                    and "not a valid icefloe stream token" in r.getMessage()]
        assert refusals
        stored = await served.stored()
        assert sorted(json.loads(p)["order_id"] for p in stored["orders"]) == ["kp1", "kp2"]


# -- by hand: the exact frames --------------------------------------------------------------

async def handshake(conn: RawKafka, version: int, mechanism: str = "PLAIN"
                    ) -> tuple[int, list[str]]:
    """SaslHandshake: (error code, the mechanisms the server offers)."""
    await conn.send(SASL_HANDSHAKE, version, Writer().string(mechanism, compact=False)
                    .getvalue())
    reader = Reader(await conn.answer())
    reader.int32()  # correlation id
    error = reader.int16()
    return error, [reader.string() for _ in range(reader.int32())]


async def authenticate(conn: RawKafka, token: str) -> tuple[int, str | None]:
    """SaslAuthenticate v2 with a PLAIN message: (error code, error message)."""
    message = b"\0any-name\0" + token.encode()
    await conn.send(SASL_AUTHENTICATE, 2, Writer().bytes_(message, compact=True)
                    .tagged_fields().getvalue())
    reader = Reader(await conn.answer())
    reader.int32()
    reader.tagged_fields()
    return reader.int16(), reader.compact_nullable_string()


async def produce_one(conn: RawKafka, topic: str, value: bytes) -> int:
    answer = await conn.produce(9, {topic: [(0, Batch([value]).encode())]})
    return answer.partition(topic, 0).error


async def test_should_answer_sasl_by_hand_as_kafka_does(tmp_path):
    async with secured(tmp_path) as served:
        conn = await served.raw()
        assert await handshake(conn, 1) == (0, ["PLAIN"])
        error, message = await authenticate(conn, "wrong")
        assert error == Code.SASL_AUTHENTICATION_FAILED
        assert "not a valid icefloe stream token" in (message or "")
        assert await conn.closed()  # then closed, as Kafka closes
        await conn.close()
        conn = await served.raw()
        assert await handshake(conn, 1, "SCRAM-SHA-512") == (
            Code.UNSUPPORTED_SASL_MECHANISM, ["PLAIN"])
        assert await conn.closed()
        await conn.close()
        conn = await served.raw()  # no SASL: the open stream only
        assert await produce_one(conn, "orders", order("anon")) == \
            Code.TOPIC_AUTHORIZATION_FAILED
        assert await produce_one(conn, "clicks", b'{"user_id":"anon"}') == 0
        await conn.close()
        conn = await served.raw()
        assert await handshake(conn, 1) == (0, ["PLAIN"])
        assert await authenticate(conn, TOKEN) == (0, None)
        assert await produce_one(conn, "orders", order("by-hand")) == 0
        await conn.close()
        conn = await served.raw()  # SaslAuthenticate without a handshake: as a broker
        assert await authenticate(conn, TOKEN) == (Code.ILLEGAL_SASL_STATE,
                                                   "SaslAuthenticate before SaslHandshake")
        assert await conn.closed()
        await conn.close()
        stored = await served.stored()
        assert [json.loads(p)["order_id"] for p in stored["orders"]] == ["by-hand"]
        metrics = await served.metrics()
    assert metrics[("icefloe_ingest_kafka_closed_total", (("reason", "sasl"),))] == 3


async def test_should_take_the_v0_handshake_with_unframed_sasl_bytes(tmp_path):
    """SaslHandshake v0: the PLAIN message follows as a bare size-prefixed blob, and a wrong
    one closes the connection without an answer (what a v0 client expects)."""
    async with secured(tmp_path) as served:
        conn = await served.raw()
        assert await handshake(conn, 0) == (0, ["PLAIN"])
        blob = b"\0any-name\0" + TOKEN.encode()
        await conn.send_raw(len(blob).to_bytes(4, "big") + blob)
        assert await conn.answer() == b""  # an empty challenge: authenticated
        assert await produce_one(conn, "orders", order("v0")) == 0
        await conn.close()
        conn = await served.raw()
        assert await handshake(conn, 0) == (0, ["PLAIN"])
        blob = b"\0any-name\0wrong"
        await conn.send_raw(len(blob).to_bytes(4, "big") + blob)
        assert await conn.closed()
        await conn.close()
        stored = await served.stored()
        assert [json.loads(p)["order_id"] for p in stored["orders"]] == ["v0"]
        conn = await served.raw()  # still serving
        await conn.send(API_VERSIONS, 0, b"")
        assert read_api_versions_v0(await conn.answer())[2][PRODUCE] == (3, 9)
        await conn.close()


# -- the plaintext rule ---------------------------------------------------------------------

async def test_should_refuse_plaintext_kafka_off_loopback(tmp_path):
    config = make_config(tmp_path / "store", (CLICKS,), host="0.0.0.0", kafka_port=0)
    with pytest.raises(ConfigError) as info:
        async with ingestor(config):
            pytest.fail("an ingestor serving plaintext Kafka on 0.0.0.0 started")
    message = str(info.value)
    assert "refusing to serve 0.0.0.0 without TLS" in message
    assert "Kafka port" in message
    assert "SASL/PLAIN" in message


async def test_should_serve_plaintext_kafka_off_loopback_when_told(tmp_path):
    config = make_config(tmp_path / "store", (CLICKS,), host="0.0.0.0", kafka_port=0,
                         plaintext=True)
    async with ingestor(config) as ports:
        assert ports.kafka is not None
        conn = await RawKafka.open(ports.kafka)
        assert await produce_one(conn, "clicks", b'{"user_id":"lan"}') == 0
        await conn.close()



async def test_should_not_answer_another_credentials_batch_as_a_duplicate(tmp_path):
    """Two tokens' producers on one stream that use the same producer id and sequences (a
    made-up or reused id): each batch is its own and stored; neither is answered as the
    other's duplicate (which would drop its records while acknowledging them)."""
    other = "another-s3cret"
    config, ca_file = tls_config(tmp_path)
    both = msgspec.structs.replace(ORDERS, tokens=(*ORDERS.tokens,
                                                   hash_token(other, log2_n=10)))
    config = msgspec.structs.replace(config, streams=(CLICKS, both))

    def batch(prefix: str) -> bytes:
        return Batch([order(f"{prefix}{i}") for i in range(2)], producer_id=77, epoch=0,
                     base_sequence=0).encode()

    async with ingestor(config) as ports:
        assert ports.kafka is not None
        served = Secured(ports.kafka, ports.http, config.store.url, ca_file)
        answers = []
        for token, prefix in ((TOKEN, "mine"), (other, "theirs")):
            conn = await served.raw()
            assert await handshake(conn, 1) == (0, ["PLAIN"])
            assert await authenticate(conn, token) == (0, None)
            answers.append((await conn.produce(9, {"orders": [(0, batch(prefix))]})
                            ).partition("orders", 0))
            await conn.close()
        assert [a.error for a in answers] == [0, 0]
        assert answers[1].base_offset != answers[0].base_offset
        stored = await served.stored()
    assert sorted(json.loads(p)["order_id"] for p in stored["orders"]) == [
        "mine0", "mine1", "theirs0", "theirs1"]


async def test_should_list_only_the_streams_a_token_may_produce_to(tmp_path):
    """Metadata for all topics (librdkafka's list_topics): the open stream, and those the
    connection's token is accepted by; never the names of other tokens' streams."""
    other = "another-s3cret"
    config, ca_file = tls_config(tmp_path)
    secret = msgspec.structs.replace(ORDERS, name="secret", table="shop.secret",
                                     tokens=(hash_token(other, log2_n=10),))
    config = msgspec.structs.replace(config, streams=(CLICKS, ORDERS, secret))
    async with ingestor(config) as ports:
        assert ports.kafka is not None
        served = Secured(ports.kafka, ports.http, config.store.url, ca_file)

        def listed(settings: dict[str, Any]) -> set[str]:
            producer = confluent_kafka.Producer(settings)
            return set(producer.list_topics(timeout=10).topics)

        assert await asyncio.to_thread(listed, served.client(**plain(TOKEN))) == {
            "clicks", "orders"}
        assert await asyncio.to_thread(listed, served.client(**plain(other))) == {
            "clicks", "secret"}
        assert await asyncio.to_thread(listed, served.client()) == {"clicks"}  # no SASL
