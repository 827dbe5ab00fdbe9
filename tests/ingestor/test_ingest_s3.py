"""The ingest path on S3 (a real moto server): durable acks, integrity checks on read."""

from __future__ import annotations

import msgspec
import pytest
from ingest_support import PAGEVIEWS, make_config

from icefloe.config import StoreSection
from icefloe.errors import IntegrityError
from icefloe.formats.batch import decode_block
from icefloe.manifest import ManifestConfig, load
from icefloe.manifest.reader import fetch_batch
from icefloe.store import open_async_store
from ingestor.runtime import IngestorRuntime, store_options


async def test_should_ingest_durably_into_s3(s3_bucket, tmp_path):
    config = make_config(tmp_path / "unused", streams=(PAGEVIEWS,))
    config = msgspec.structs.replace(config, store=StoreSection(
        url=s3_bucket.url, endpoint_url=s3_bucket.endpoint_url, region="us-east-1"))
    runtime = await IngestorRuntime.start(config)  # probes moto's conditional writes too
    try:
        stream = runtime.service.stream("pageviews")
        body = b'[{"user_id":"a"},{"user_id":"b","ts":1795428000000}]'
        assert await runtime.service.ingest(stream, stream.from_json(body),
                                            idempotency_key="k") == 2
    finally:
        await runtime.close(10)
    store = open_async_store(s3_bucket.url, store_options(config))
    try:
        manifest = (await load(store, ManifestConfig().key)).manifest
        (entry,) = manifest.entries
        assert entry.location.startswith("batches/")
        data = await fetch_batch(store, entry)
        assert decode_block(data)[1] == 2
        # a corrupted object is caught by the checksum the manifest recorded
        await store.put(entry.location, data[:-8] + b"\x00" * 8)
        with pytest.raises(IntegrityError, match=r"CRC32C .* the manifest recorded"):
            await fetch_batch(store, entry)
        await store.put(entry.location, data[:-1])
        with pytest.raises(IntegrityError, match=rf"is {len(data) - 1} bytes, the manifest "
                                                 rf"recorded {len(data)}"):
            await fetch_batch(store, entry)
    finally:
        await store.close()
