"""Fetch the batch file a manifest entry points at, verifying its size and checksum.

Why verify here: the manifest records each batch's size and CRC32C when it is appended, so
a reader can tell a truncated or corrupted object (a bad disk, a buggy S3 clone, a partial
copy) from a valid one before decoding it, and report exactly which file is bad.
"""

from __future__ import annotations

from icefloe.checksum import crc32c
from icefloe.errors import IntegrityError
from icefloe.manifest.model import Entry
from icefloe.store.base import AsyncObjectStore, ObjectStore


def verify(entry: Entry, data: bytes) -> bytes:
    """Return ``data`` if it matches the entry's size and CRC32C; else IntegrityError."""
    return verify_bytes(data, location=entry.location, sequence=entry.sequence,
                        size=entry.size, checksum=entry.crc32c)


def verify_bytes(data: bytes, *, location: str, sequence: int, size: int,
                 checksum: int) -> bytes:
    """:func:`verify` for callers that carry the entry's fields, not an ``Entry``."""
    if len(data) != size:
        raise IntegrityError(f"batch {location} (sequence {sequence}) is "
                             f"{len(data)} bytes, the manifest recorded {size}")
    actual = crc32c(data)
    if actual != checksum:
        raise IntegrityError(f"batch {location} (sequence {sequence}) has CRC32C "
                             f"{actual:#010x}, the manifest recorded {checksum:#010x}")
    return data


async def fetch_batch(store: AsyncObjectStore, entry: Entry) -> bytes:
    """The verified bytes of ``entry``'s batch file (NotFound if it is gone)."""
    return verify(entry, (await store.get(entry.location)).data)


def fetch_batch_sync(store: ObjectStore, entry: Entry) -> bytes:
    """Synchronous twin of :func:`fetch_batch`, for Spark workers."""
    return verify(entry, store.get(entry.location).data)
