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

from icefloe.errors import NotFound
from icefloe.store.base import AsyncObjectStore

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


async def publish(store: AsyncObjectStore, address: Address) -> None:
    """Write ``address`` (last writer wins: the newest holder is the one that counts)."""
    await store.put(KEY, msgspec.json.encode(address))


async def read(store: AsyncObjectStore) -> Address | None:
    """The published address, or None if there is none or it cannot be decoded (then the
    config's address is asked, as before any collector published one)."""
    try:
        data = (await store.get(KEY)).data
    except NotFound:
        return None
    try:
        return msgspec.json.decode(data, type=Address)
    except msgspec.DecodeError as exc:
        log.warning("the collector address %r cannot be decoded (%s); using the config's",
                    KEY, exc)
        return None
