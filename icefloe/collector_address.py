"""Where the active collector answers HTTP: published by the collector that takes the lease,
read by ``icefloe run``.

Why: the lease names its holder (``collector-<ULID>``), not an address, and the collector's
``[collector] metrics_port`` in a shared config is not always where the holder listens:
``icefloe up``'s warm standby serves on a free port (the configured one is its parent's),
so once it took over, ``icefloe run`` asked the configured port, reached a standby and
exited with "not the holder". So a collector that becomes active writes one small object
(:data:`KEY`, in the store's control location) naming its holder, epoch and the host and
port it serves on; ``icefloe run`` uses it when its holder is the lease's holder, which
also makes a record left by an earlier collector harmless (its holder no longer matches).
It only says where to ask: nothing here decides who may commit (epochs and the lease do).
"""

from __future__ import annotations

import logging

import msgspec

from icefloe.errors import NotFound, PreconditionFailed
from icefloe.store.base import AsyncObjectStore, GetResult

log = logging.getLogger("icefloe.collector")

KEY = "collector/address.json"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class Address(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """The active collector's HTTP endpoint (``host`` as configured: a wildcard host is
    asked on the loopback address, as the config's own is)."""

    holder: str
    epoch: int
    scheme: str
    host: str
    port: int

    def url(self) -> str:
        return local_url(self.scheme, self.host, self.port)


def local_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, a wildcard ``host`` as 127.0.0.1, an IPv6 one bracketed."""
    host = "127.0.0.1" if host in WILDCARD_HOSTS else host
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}"


PUBLISH_RACES = 8
"""How often :func:`publish` looks again after another writer changed the record between
its read and its conditional write (two holders at most write it at once)."""


async def publish(store: AsyncObjectStore, address: Address) -> bool:
    """Write ``address`` unless a newer holder's is there; False when one is.

    Why conditional: a collector whose first write failed keeps trying in the background
    (:func:`collector.runner._publish_address`), so its write may come after a newer
    holder's; last writer wins would then hide the newer holder (``icefloe up``'s standby
    on a free port) from ``icefloe run``. So the record only moves to a higher epoch or to
    the same one: read it, then write with its ETag (or "absent") as the condition, and
    look again when someone wrote in between.
    """
    data = msgspec.json.encode(address)
    for _ in range(PUBLISH_RACES):
        current = await _current(store)
        if current is not None:
            theirs = _decoded(current.data)
            if theirs is not None and theirs.epoch > address.epoch:
                return False
            if theirs == address:
                return True
        try:
            if current is None:
                await store.put(KEY, data, if_none_match="*")
            else:
                await store.put(KEY, data, if_match=current.etag)
            return True
        except PreconditionFailed:
            continue  # written in between (or our own retried write landed): look again
    raise PreconditionFailed(f"{KEY} changed under every one of {PUBLISH_RACES} writes",
                             op="put", key=KEY)


async def _current(store: AsyncObjectStore) -> GetResult | None:
    try:
        return await store.get(KEY)
    except NotFound:
        return None


def _decoded(data: bytes) -> Address | None:
    try:
        return msgspec.json.decode(data, type=Address)
    except msgspec.DecodeError:
        return None


async def read(store: AsyncObjectStore) -> Address | None:
    """The published address, or None if there is none or it cannot be decoded (then the
    config's address is asked, as before any collector published one)."""
    current = await _current(store)
    if current is None:
        return None
    try:
        return msgspec.json.decode(current.data, type=Address)
    except msgspec.DecodeError as exc:
        log.warning("the collector address %r cannot be decoded (%s); using the config's",
                    KEY, exc)
        return None
