"""The gRPC front's request parse: the compiled reader agrees with protobuf, or defers to it.

The compiled ``publish_request`` (``icefloe/formats/_speedups.pyx``) reads the plain encoding
clients send; for anything else it answers None and :func:`parse_request` lets protobuf
decide. So the property is: whenever it answers, protobuf decodes the same bytes to the same
fields; whenever protobuf refuses bytes, it does not answer.
"""

from __future__ import annotations

import random

import pytest

from icefloe.formats import speedups
from icefloe.v1 import ingest_pb2
from ingestor import grpc_app
from ingestor.grpc_app import Malformed, Request, parse_request

COMPILED = getattr(speedups.compiled, "publish_request", None)
needs_compiled = pytest.mark.skipif(COMPILED is None,
                                    reason="the compiled speedups are not built here")

TEXTS = ["", "pageviews", "orders", "é-ü", "日本", "x" * 300, "emoji-\U0001F600"]


def random_request(rng: random.Random) -> ingest_pb2.PublishRequest:
    events = []
    for _ in range(rng.choice([0, 1, 2, 5, 40])):
        event = ingest_pb2.Event()
        if rng.random() < 0.9:
            event.json = rng.choice([b"", b"{}", b'{"a":1}', bytes(rng.randbytes(20)),
                                     b'{"u":"' + b"z" * rng.randint(0, 200) + b'"}'])
        if rng.random() < 0.3:
            event.event_id = rng.choice(TEXTS)
        if rng.random() < 0.2:
            event.data = rng.randbytes(rng.randint(0, 40))
        events.append(event)
    return ingest_pb2.PublishRequest(stream=rng.choice(TEXTS), events=events,
                                     request_id=rng.choice(TEXTS))


def by_protobuf(data: bytes) -> Request | None:
    try:
        return Request.of(ingest_pb2.PublishRequest.FromString(data))
    except Exception:
        return None


def mutated(rng: random.Random, data: bytes) -> bytes:
    """``data`` with one of the edits a broken or unusual client could make."""
    edit = rng.randrange(8)
    if edit == 0 and data:  # truncated
        return data[:rng.randrange(len(data))]
    if edit == 1 and data:  # one byte changed
        at = rng.randrange(len(data))
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]
    if edit == 2:  # an unknown field, before or after
        unknown = rng.choice([b"\x20\x05", b"\x2a\x01x", b"\x31" + b"\0" * 8, b"\x3d\0\0\0\0",
                              b"\x23\x24"])  # varint, bytes, fixed64, fixed32, a group
        return unknown + data if rng.random() < 0.5 else data + unknown
    if edit == 3:  # a string that is not UTF-8
        return data + rng.choice([b"\x0a\x02\xc3\x28", b"\x1a\x01\xff",
                                  b"\x12\x04\x12\x02\xed\xa0"])
    if edit == 4:  # an Event field given twice, or a known field with another wire type
        return data + rng.choice([b"\x12\x06\x0a\x01a\x0a\x01b", b"\x12\x04\x12\x01a\x12\x00",
                                  b"\x08\x01", b"\x12\x02\x08\x01"])
    if edit == 5:  # a length that is longer than it needs to be (still valid protobuf)
        return data + b"\x0a\x82\x00ab"
    if edit == 6:  # stream and request_id again: the last one counts
        return data + b"\x0a\x03abc\x1a\x01z"
    return data + bytes(rng.randbytes(rng.randint(1, 6)))  # trailing garbage


@needs_compiled
def test_should_read_what_protobuf_reads_from_any_request_a_client_encodes():
    rng = random.Random(1)
    for _ in range(3000):
        data = random_request(rng).SerializeToString()
        assert COMPILED is not None
        fields = COMPILED(data)
        assert fields is not None, data  # the plain encoding: never deferred
        assert Request(*fields) == by_protobuf(data)


@needs_compiled
def test_should_agree_with_protobuf_or_defer_to_it_on_unusual_or_broken_bytes():
    rng = random.Random(2)
    answered = deferred = 0
    for _ in range(20000):
        data = mutated(rng, random_request(rng).SerializeToString())
        assert COMPILED is not None
        fields = COMPILED(data)
        expected = by_protobuf(data)
        if fields is None:
            deferred += 1
            continue
        answered += 1
        assert expected is not None, f"protobuf refuses what the compiled parse took: {data!r}"
        assert Request(*fields) == expected, data
    assert answered > 1000  # both sides of the property were exercised
    assert deferred > 1000


def test_should_parse_every_request_the_same_with_or_without_the_compiled_reader(
        monkeypatch):
    rng = random.Random(3)
    samples = [mutated(rng, random_request(rng).SerializeToString()) for _ in range(2000)]
    fast = [parse_request(data) for data in samples]
    monkeypatch.setattr(grpc_app, "_COMPILED_PARSE", None)
    assert [parse_request(data) for data in samples] == fast
    refused = [answer for answer in fast if isinstance(answer, Malformed)]
    assert refused
    assert all("not a valid icefloe.v1.PublishRequest" in m.reason for m in refused)


def test_should_leave_ids_and_data_unset_unless_an_event_sets_one():
    plain = ingest_pb2.PublishRequest(stream="s", events=[
        ingest_pb2.Event(json=b"{}"), ingest_pb2.Event(json=b'{"a":1}')])
    assert parse_request(plain.SerializeToString()) == \
        Request("s", "", [b"{}", b'{"a":1}'], None, None)
    mixed = ingest_pb2.PublishRequest(stream="s", request_id="r", events=[
        ingest_pb2.Event(json=b"{}"), ingest_pb2.Event(event_id="e2", data=b"\x08\x01")])
    assert parse_request(mixed.SerializeToString()) == \
        Request("s", "r", [b"{}", b""], ["", "e2"], [b"", b"\x08\x01"])
