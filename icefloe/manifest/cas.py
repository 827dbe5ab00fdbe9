"""Read-modify-write of the manifest with compare-and-swap, shared by producer and consumer.

The loop itself is :func:`icefloe.store.cas.cas_document` (the stream registry uses it
too); this module fixes the document type and keeps the manifest's names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from icefloe.clock import SYSTEM, Clock
from icefloe.manifest.model import Manifest
from icefloe.store.base import AsyncObjectStore
from icefloe.store.cas import CasStats, LastWritten, Versioned, cas_document, load_document
from icefloe.store.retry import RetryPolicy

__all__ = ["CasStats", "LastWritten", "Loaded", "cas_update", "load"]


@dataclass(frozen=True, slots=True)
class Loaded:
    """A manifest as read, with what the next CAS needs and the store's clock."""

    manifest: Manifest
    etag: str | None
    store_time: float
    size: int


def _loaded(doc: Versioned[Manifest]) -> Loaded:
    return Loaded(doc.value, doc.etag, doc.store_time, doc.size)


async def load(store: AsyncObjectStore, key: str, *, clock: Clock = SYSTEM) -> Loaded:
    """Read and decode the manifest; a missing one reads as empty (etag None)."""
    return _loaded(await load_document(store, key, Manifest.decode, Manifest, clock=clock))


async def cas_update(store: AsyncObjectStore, key: str,
                     mutate: Callable[[Loaded], Manifest | None], *,
                     backoff: RetryPolicy, stats: CasStats | None = None,
                     last: LastWritten[Manifest] | None = None, clock: Clock = SYSTEM
                     ) -> tuple[Loaded, Manifest | None]:
    """Apply ``mutate`` atomically; return what was read and what was written (or None).

    ``mutate`` returns None when nothing needs writing; it may raise to abort (fencing,
    full queue). Lost races retry with jittered backoff until ``backoff`` gives up.
    ``last``: see :class:`~icefloe.store.cas.LastWritten`; ``clock`` times backoff and
    budget.
    """
    loaded, new = await cas_document(store, key, Manifest.decode, Manifest,
                                     lambda doc: mutate(_loaded(doc)), backoff=backoff,
                                     stats=stats, what="manifest", last=last,
                                     clock=clock)
    return _loaded(loaded), new
