"""Fetch and decode the batch files of one partition: shared by Spark workers and local runs.

Why the error split matters: a checksum or format problem that survives re-reading is a
property of the file, so it becomes one dead letter and the queue moves on; a missing file,
a timeout or a throttled read is a property of the moment, so it is raised — the run fails,
the collector backs off and retries, and nothing is ever skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence

from icefloe.errors import IntegrityError
from icefloe.manifest.reader import verify_bytes
from icefloe.store import open_store, options_for
from icefloe.store.base import ObjectStore
from pipeline.load.decode import Decoded, Plan, decode_batch_file
from pipeline.load.spec import EntryFile

INTEGRITY_ATTEMPTS = 3
INTEGRITY_PAUSE_S = 0.2
QUARANTINE_PREFIX = "quarantine/"
CORRUPT = "corrupt_batch:"


def open_run_store(url: str, endpoint_url: str | None, region: str | None) -> ObjectStore:
    return open_store(url, options_for(endpoint_url, region))


def fetch_and_decode(store: ObjectStore, ref: EntryFile,
                     schemas: Mapping[str, Plan]) -> Decoded:
    """Read ``ref`` (re-reading on a checksum mismatch, with a pause) and decode it.

    A file that stays corrupt is copied to ``quarantine/<its key>`` before its dead letter
    is returned: batch-file GC deletes it once its entry is dequeued, and the acknowledged
    events inside must stay recoverable by hand.
    """
    problem: IntegrityError | None = None
    for attempt in range(INTEGRITY_ATTEMPTS):
        if attempt:
            time.sleep(INTEGRITY_PAUSE_S * attempt)
        data = store.get(ref.location).data  # NotFound / transient errors propagate
        try:
            verify_ref(ref, data)
        except IntegrityError as exc:
            problem = exc
            continue
        out = decode_batch_file(data, ref, schemas)
        if any(reason.startswith(CORRUPT) for reason in out.dead.reason):
            _quarantine(store, ref, data, out)
        return out
    out = Decoded()
    assert problem is not None
    out.dead.add(ref, reason=f"{CORRUPT}integrity", message=str(problem))
    _quarantine(store, ref, data, out)
    return out


def _quarantine(store: ObjectStore, ref: EntryFile, data: bytes, out: Decoded) -> None:
    key = QUARANTINE_PREFIX + ref.location
    store.put(key, data)  # idempotent: a re-run writes the same bytes
    for i, reason in enumerate(out.dead.reason):
        if reason.startswith(CORRUPT):
            out.dead.message[i] += f" (file copied to {key})"


def verify_ref(ref: EntryFile, data: bytes) -> None:
    verify_bytes(data, location=ref.location, sequence=ref.sequence, size=ref.size,
                 checksum=ref.crc32c)


def decode_refs(store: ObjectStore, refs: Sequence[EntryFile],
                schemas: Mapping[str, Plan]) -> Iterator[tuple[EntryFile, Decoded]]:
    for ref in refs:
        yield ref, fetch_and_decode(store, ref, schemas)
