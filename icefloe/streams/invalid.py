"""Invalid events kept as dead letters (``on_invalid = "dead_letter"``): how they travel.

Why through the batch file and the manifest, as records of their own: a dead letter must be
as durable as the accepted events of its request (it is acknowledged with them, in the
same batch, by the same 202) and must land in ``icefloe.dead_letters`` exactly once, which
is what the collector's ordered, sequence-checked commits already give every record. The
record's envelope names the stream :func:`invalid_stream` (a name no stream can have: stream
names start with a letter or digit), and its payload is one JSON line with the reason and
the event as it was sent (:func:`invalid_payload`); the collector turns each into a dead
letter row (:func:`parse_invalid`) and never routes it to a table.
"""

from __future__ import annotations

from typing import Any

import msgspec

INVALID_PREFIX = "!invalid:"
"""Envelope stream name prefix of a dead-lettered invalid event (then its stream's name)."""
INVALID_REASON = "invalid_event"
"""The dead letter's ``reason``; its ``message`` says which field and why."""


def invalid_stream(stream: str) -> str:
    """The envelope stream name of ``stream``'s invalid events."""
    return INVALID_PREFIX + stream


def stream_of_invalid(name: str) -> str | None:
    """The stream an envelope stream name holds invalid events of (None: a normal one)."""
    return name[len(INVALID_PREFIX):] if name.startswith(INVALID_PREFIX) else None


def invalid_payload(code: str, field: str | None, reason: str, raw: bytes) -> bytes:
    """One line of JSON: why the event was refused and the event as it was sent."""
    return msgspec.json.encode({"code": code, "field": field, "reason": reason,
                                "raw": raw.decode("utf-8", "replace")})


def parse_invalid(payload: bytes) -> tuple[str, bytes]:
    """``(message, raw event bytes)`` of an invalid event's payload."""
    data: dict[str, Any] = msgspec.json.decode(payload)
    field = data.get("field")
    reason = str(data.get("reason", ""))
    message = f"{data.get('code', 'validation_failed')}: " + \
        (f"{field}: {reason}" if field else reason)
    return message, str(data.get("raw", "")).encode()
