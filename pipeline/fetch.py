"""Fetch and decode the batch files of one partition: shared by Spark workers and local runs.

Why the error split matters: a checksum or format problem that survives re-reading is a
property of the file, so it becomes one dead letter and the queue moves on; a missing file,
a timeout or a throttled read is a property of the moment, so it is raised — the run fails,
the collector backs off and retries, and nothing is ever skipped.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa

from icefloe.errors import IntegrityError
from icefloe.reader import verify_bytes
from icefloe.store import open_store, options_for
from icefloe.store.base import ObjectStore
from pipeline.decode import BatchRef, Decoded, decode_batch_file

INTEGRITY_ATTEMPTS = 3


def open_run_store(url: str, endpoint_url: str | None, region: str | None) -> ObjectStore:
    return open_store(url, options_for(endpoint_url, region))


def fetch_and_decode(store: ObjectStore, ref: BatchRef,
                     schemas: Mapping[str, pa.Schema]) -> Decoded:
    """Read ``ref`` (re-reading on a checksum mismatch) and decode it."""
    problem: IntegrityError | None = None
    for _ in range(INTEGRITY_ATTEMPTS):
        data = store.get(ref.location).data  # NotFound / transient errors propagate
        try:
            verify_ref(ref, data)
        except IntegrityError as exc:
            problem = exc
            continue
        return decode_batch_file(data, ref, schemas)
    out = Decoded()
    assert problem is not None
    out.dead.add(ref, reason="corrupt_batch:integrity", message=str(problem))
    return out


def verify_ref(ref: BatchRef, data: bytes) -> None:
    verify_bytes(data, location=ref.location, sequence=ref.sequence, size=ref.size,
                 checksum=ref.crc32c)


def decode_refs(store: ObjectStore, refs: Sequence[BatchRef],
                schemas: Mapping[str, pa.Schema]) -> Iterator[tuple[BatchRef, Decoded]]:
    for ref in refs:
        yield ref, fetch_and_decode(store, ref, schemas)
