"""One store over two locations: batch files in the data location, the rest in control.

Why two: the manifest queue is a single object rewritten by compare-and-swap on every
append, ack and lease renewal (tens of times per second), the registry and staging state are
rewritten the same way. Batch files and the warehouse belong in a versioned bucket (an
accidental delete can be undone); the objects rewritten in place do not: in a versioned
bucket each rewrite keeps a noncurrent version, millions of them for one key within days,
and S3 throttles that key with 503 SlowDown. ``[store] control_url`` names an unversioned
location for them; ``[store] url`` stays where batch files are written (and where Spark reads
them, since manifest entries record keys relative to it).

Routing is by key: ``batches/`` and ``quarantine/`` (batch files and their quarantined
copies) go to the data store, every other key (manifest, registry, staging, the start-up
probe) to the control store. A listing whose prefix could match both is merged.
"""

from __future__ import annotations

from icefloe.store.base import (
    AsyncObjectStore,
    Encodable,
    EncodedPut,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    PutResult,
)

DATA_PREFIXES = ("batches/", "quarantine/")
"""Keys under these prefixes are batch files (``icefloe.manifest.publish``) or copies of corrupt
ones (``pipeline.load.fetch``): the data location. Everything else is control state."""


def is_data_key(key: str) -> bool:
    return key.startswith(DATA_PREFIXES)


class SplitAsyncStore(AsyncObjectStore):
    """Routes each key to ``data`` or ``control`` (see the module docstring)."""

    def __init__(self, data: AsyncObjectStore, control: AsyncObjectStore) -> None:
        self.data = data
        self.control = control
        self.url = data.url

    def _for(self, key: str) -> AsyncObjectStore:
        return self.data if is_data_key(key) else self.control

    async def get(self, key: str) -> GetResult:
        return await self._for(key).get(key)

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        return await self._for(key).put(key, data, if_match=if_match,
                                        if_none_match=if_none_match)

    async def put_encoded(self, key: str, body: Encodable) -> EncodedPut:
        return await self._for(key).put_encoded(key, body)

    def encodes_inline(self, body: Encodable) -> bool:
        return self.data.encodes_inline(body)

    async def delete(self, key: str) -> None:
        await self._for(key).delete(key)

    async def head(self, key: str) -> ObjectInfo:
        return await self._for(key).head(key)

    async def list(self, prefix: str = "") -> ListResult:
        if is_data_key(prefix):
            return await self.data.list(prefix)
        if not any(p.startswith(prefix) for p in DATA_PREFIXES):
            return await self.control.list(prefix)
        # "" or a prefix of "batches/": both locations may hold matching keys
        data = await self.data.list(prefix)
        control = await self.control.list(prefix)
        merged = sorted([*data.objects, *control.objects], key=lambda info: info.key)
        return ListResult(merged, data.store_time)

    async def close(self) -> None:
        try:
            await self.data.close()
        finally:
            await self.control.close()
