"""The object-store interface every part of icefloe talks to.

Why so small: correctness rests on five operations only (get, conditional put, delete,
list by prefix, head). Keeping the surface tiny lets one contract test suite pin the
behaviour of every backend (local directory, S3/MinIO via boto3, S3 via aiobotocore), and
lets fault injection wrap any store at this single boundary.

Times are seconds since the epoch **on the store's clock** (S3's ``Date``/``Last-Modified``
headers, the local file system's clock for ``file://``). Deadlines and garbage collection
compare store times only, so a skewed ingestor clock cannot make GC unsafe.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass
from typing import Literal, Protocol

from icefloe.checksum import crc32c

IfNoneMatch = Literal["*"] | None

INLINE_ENCODE_BYTES = 256 * 1024
"""Bodies up to this raw size are encoded on the event loop (zstd: ~0.6 ms at most); larger
ones in a worker thread. A thread hop costs a loop turn, which under load is milliseconds."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """Metadata of one stored object. ``etag`` may be None in listings of the local store."""

    key: str
    size: int
    last_modified: float
    etag: str | None = None


@dataclass(frozen=True, slots=True)
class GetResult:
    """The bytes of an object plus what a later conditional write needs (its ETag)."""

    data: bytes
    etag: str
    last_modified: float
    store_time: float


@dataclass(frozen=True, slots=True)
class PutResult:
    """The new ETag and the store's clock when the write was acknowledged."""

    etag: str
    store_time: float


@dataclass(frozen=True, slots=True)
class ListResult:
    """Objects under a prefix (sorted by key) and the store's clock at listing time."""

    objects: list[ObjectInfo]
    store_time: float


class Encodable(Protocol):
    """A body whose stored bytes are computed by the store, where that is cheapest.

    Why: compressing a batch is the largest single piece of an ingestor's flush. A store
    with a helper process (the ingestor's ``ingestor.store_helper``) encodes there, off the
    event loop and without competing for its GIL; every other store encodes in place. Must
    pickle.
    """

    def __len__(self) -> int:
        """Raw size in bytes (what encoding costs is proportional to)."""
        ...

    def encode(self) -> bytes:
        """The bytes to store (deterministic: a retried put stores the same bytes)."""
        ...


@dataclass(frozen=True, slots=True)
class EncodedPut:
    """A :meth:`AsyncObjectStore.put_encoded`: the write, and the size and CRC32C of the
    bytes it stored (what a manifest entry records)."""

    result: PutResult
    size: int
    crc32c: int


def encode_for_put(body: Encodable) -> tuple[bytes, int]:
    """``body``'s stored bytes and their CRC32C."""
    data = body.encode()
    return data, crc32c(data)


class ObjectStore(abc.ABC):
    """Synchronous store, for Spark workers, the CLI and tests.

    Keys are ``/``-separated relative paths. ``put`` sends a CRC32C checksum with the body
    so the store can reject a corrupted upload. Conditional puts raise
    :class:`~icefloe.errors.PreconditionFailed` when the condition does not hold.
    """

    url: str

    @abc.abstractmethod
    def get(self, key: str) -> GetResult: ...

    @abc.abstractmethod
    def put(self, key: str, data: bytes, *, if_match: str | None = None,
            if_none_match: IfNoneMatch = None) -> PutResult: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing key is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> ListResult: ...

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default has nothing to release."""


class AsyncObjectStore(abc.ABC):
    """The same contract as :class:`ObjectStore`, for asyncio servers (ingestor, collector)."""

    url: str

    @abc.abstractmethod
    async def get(self, key: str) -> GetResult: ...

    @abc.abstractmethod
    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult: ...

    @abc.abstractmethod
    async def delete(self, key: str) -> None: ...

    @abc.abstractmethod
    async def list(self, prefix: str = "") -> ListResult: ...

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo: ...

    async def put_encoded(self, key: str, body: Encodable) -> EncodedPut:
        """Store ``body.encode()`` under ``key`` (unconditionally, like a batch file).

        The default encodes here (small bodies inline, large ones in a thread) and calls
        :meth:`put`; a store that can encode elsewhere overrides it.
        """
        if self.encodes_inline(body):
            data, checksum = encode_for_put(body)
        else:
            data, checksum = await asyncio.to_thread(encode_for_put, body)
        return EncodedPut(await self.put(key, data), len(data), checksum)

    def encodes_inline(self, body: Encodable) -> bool:
        """Whether :meth:`put_encoded` encodes ``body`` on the event loop (small bodies)
        rather than in a thread."""
        return len(body) <= INLINE_ENCODE_BYTES

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default has nothing to release."""


def check_key(key: str) -> str:
    """Reject keys that could escape a prefix or alias another key; return it unchanged."""
    if not key or key.startswith("/") or key.endswith("/"):
        raise ValueError(f"invalid object key {key!r}: must be a non-empty relative path")
    for part in key.split("/"):
        if part in ("", ".", "..") or part.startswith(".icefloe-"):
            raise ValueError(f"invalid object key {key!r}: bad path segment {part!r}")
    return key
