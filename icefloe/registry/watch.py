"""Follow the registry object: every ingestor and the collector pick up a change within
``[admin] registry_poll_s`` (default 2 s), without a restart.

Why polling: an object store has no change notifications that work the same on S3, MinIO
and a local directory, and the registry is a few kilobytes — one GET every couple of seconds
per process costs nothing. A failed read keeps the last good version in use (logged and
counted): an unreachable store must not take streams away from a running ingestor.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Sequence

from icefloe.clock import SYSTEM, Clock
from icefloe.config import StreamConfig
from icefloe.registry.model import Registry
from icefloe.registry.store import RegistryStore, drift, refuse_conflicts
from icefloe.store.base import AsyncObjectStore

log = logging.getLogger("icefloe.registry")


class RegistryWatch:
    """Polls one registry object and calls ``on_change`` with each newer version."""

    def __init__(self, store: AsyncObjectStore, key: str,
                 on_change: Callable[[Registry], object], *, poll_s: float = 2.0,
                 on_error: Callable[[Exception], None] | None = None,
                 config_streams: Sequence[StreamConfig] = (),
                 clock: Clock = SYSTEM) -> None:
        self.registry = RegistryStore(store, key, clock=clock)
        self.on_change = on_change
        self.on_error = on_error
        self.poll_s = poll_s
        self.config_streams = config_streams
        self.version = 0
        self.current: Registry | None = None
        self._etag: str | None = None

    async def check(self) -> Registry | None:
        """One look; returns the registry if it changed (after ``on_change`` ran). The
        version counts as applied only once ``on_change`` (sync or async) succeeded, so a
        failed apply is retried at the next look."""
        loaded = await self.registry.load()
        if loaded.etag is None or loaded.etag == self._etag:
            return None
        registry = loaded.value
        if registry.version <= self.version:
            self._etag = loaded.etag
            return None
        if self.current is None:  # at start: a table declared twice stops it
            refuse_conflicts(registry, self.config_streams, "config and registry")
            for note in drift(registry, self.config_streams):
                log.warning("config and registry differ (the registry is used): %s", note)
        outcome = self.on_change(registry)
        if inspect.isawaitable(outcome):
            await outcome
        self._etag = loaded.etag
        self.current, self.version = registry, registry.version
        return registry

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set; errors are logged and the last version stays."""
        failures = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)
            if stop.is_set():
                return
            try:
                await self.check()
                failures = 0
            except Exception as exc:
                failures += 1
                if self.on_error is not None:
                    self.on_error(exc)
                if failures == 1 or failures % 30 == 0:
                    log.warning("cannot read the stream registry (%d in a row); keeping "
                                "version %d: %s", failures, self.version, exc)
