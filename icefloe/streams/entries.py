"""Opaque byte entries: a ``payload = "bytes"`` stream's events, as opendata's buffer has them.

Why as a canonical JSON payload and not raw bytes in the envelope: the envelope, the batch
file, the manifest, the collector's columnar decode and every reader already carry
canonical JSON whose ``binary`` columns are base64 text (:mod:`icefloe.streams.native`). An
entry is therefore stored as ``{"<column>":"<base64>"}`` in its stream's single ``binary``
column, and comes back as the same bytes from the table (a Parquet ``BINARY``) and from the
in-process reader (:func:`entry_bytes`). A raw LF/CR byte, which a payload may not hold,
cannot occur in base64.
"""

from __future__ import annotations

import base64
import binascii

import msgspec

from icefloe.streams.model import StreamConfig


def entry_payload(stream: StreamConfig, entry: bytes | bytearray | memoryview) -> bytes:
    """The canonical payload holding ``entry`` in ``stream``'s binary column."""
    column = stream.columns[0].name
    return b'{"%s":"%s"}' % (column.encode(), base64.b64encode(entry))


def entry_bytes(stream: StreamConfig, payload: bytes) -> bytes:
    """The entry a canonical payload of ``stream`` holds (what :func:`entry_payload` wrapped,
    or what a JSON client sent as base64 in the column)."""
    value = msgspec.json.decode(payload).get(stream.columns[0].name)
    if value is None:
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:  # not written by icefloe: say so rather than guess
        raise ValueError(f"stream {stream.name!r}: payload column is not base64: {exc}") from None
