"""The HTTP front's limits as plain decisions (:mod:`ingestor.http.limits`), no server.

``test_http_limits.py`` proves them on real servers through raw sockets; these pin each
boundary exactly (one byte, one field, one connection over) and what the protocol class is
made of (issue #38: a module-level class, bound to one server by :func:`guarded_protocol`).
"""

from __future__ import annotations

import httptools
import pytest
from prometheus_client import CollectorRegistry, Counter

from ingestor.http.limits import (
    CODING_REFUSAL,
    VERSION_REFUSAL,
    HttpLimits,
    Refusal,
    framing_refusal,
    parse_error_refusal,
    refusal_response,
)
from ingestor.http.server import GuardedHttpToolsProtocol, guarded_protocol
from ingestor.http.slow_clients import SlowClientGuard

LIMITS = HttpLimits(max_header_bytes=100, max_headers=3, max_connections=2)


def test_should_refuse_a_head_one_byte_over_max_header_bytes():
    assert LIMITS.head_refusal(100) is None
    refusal = LIMITS.head_refusal(101)
    assert refusal is not None
    assert (refusal.status, refusal.reason, refusal.code) == (431, "header_bytes",
                                                              "header_too_large")
    assert "100 bytes" in refusal.message
    assert "ingestor.max_header_bytes" in refusal.message


def test_should_refuse_the_header_field_after_max_headers():
    assert LIMITS.header_count_refusal(2) is None  # the third field is allowed
    refusal = LIMITS.header_count_refusal(3)  # three before it: the fourth is one too many
    assert refusal is not None
    assert (refusal.status, refusal.reason, refusal.code) == (431, "header_count",
                                                              "too_many_headers")
    assert "more than 3 header fields" in refusal.message


def test_should_close_the_connection_one_over_max_connections():
    assert not LIMITS.too_many_connections(2)
    assert LIMITS.too_many_connections(3)


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_should_pass_http1_without_or_with_plain_chunked_framing(version):
    assert framing_refusal(version, None) is None
    assert framing_refusal(version, [b"chunked"]) is None
    assert framing_refusal(version, [b" Chunked "]) is None


@pytest.mark.parametrize("version", ["2.0", "0.9", "1.2"])
def test_should_refuse_other_http_versions_with_505(version):
    assert framing_refusal(version, None) == VERSION_REFUSAL
    assert VERSION_REFUSAL.status == 505


@pytest.mark.parametrize("codings", [[b"gzip, chunked"], [b"gzip", b"chunked"],
                                     [b"chunked, chunked"], [b"identity"], [b""]])
def test_should_refuse_transfer_codings_other_than_plain_chunked_with_501(codings):
    assert framing_refusal("1.1", codings) == CODING_REFUSAL
    assert CODING_REFUSAL.status == 501


def test_should_tell_http2_from_garbage_when_the_parser_gives_up():
    error = httptools.HttpParserError("invalid method")
    assert parse_error_refusal(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", error) == VERSION_REFUSAL
    garbage = parse_error_refusal(b"\x16\x03\x01 not http", error)
    assert (garbage.status, garbage.code) == (400, "malformed_request")
    assert "(invalid method)" in garbage.message
    unnamed = parse_error_refusal(b"x", httptools.HttpParserError())
    assert "(HttpParserError)" in unnamed.message


def test_should_write_a_whole_json_refusal_that_closes():
    answer = refusal_response(431, "header_too_large", "too big")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 431 ")
    assert b"connection: close" in head
    assert b"content-length: %d" % len(body) in head
    assert body == b'{"error":"header_too_large","message":"too big","details":[]}'


def test_should_count_a_refusal_by_its_reason():
    refused = Counter("refused", "r", ["reason"], registry=CollectorRegistry())
    limits = HttpLimits(refused=refused)
    limits.count("header_bytes")
    limits.count("header_bytes")
    assert refused.labels("header_bytes")._value.get() == 2
    HttpLimits().count("header_bytes")  # no counter: nothing to count, no error


def test_should_bind_the_module_level_protocol_to_one_servers_settings():
    guard = SlowClientGuard(10, 20, 1024)
    bound = guarded_protocol(guard, None, LIMITS)
    assert issubclass(bound, GuardedHttpToolsProtocol)
    assert (bound.slow_guard, bound.fast_lane, bound.http_limits) == (guard, None, LIMITS)
    other = guarded_protocol(guard)
    assert other.http_limits == HttpLimits()
    assert bound.http_limits is LIMITS
    assert isinstance(LIMITS.head_refusal(10**6), Refusal)
