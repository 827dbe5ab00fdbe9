"""The registry in the object store: read it, change it by compare-and-swap, seed it.

Why the object store: it is the one piece of shared state every icefloe process already
reaches (the manifest lives there), so the registry needs no database of its own, and two
admin processes changing it at once cannot lose an update — the loser of the CAS re-reads
and re-applies its change (with its checks) to the winner's version.

Seeding: on first start the registry is empty and the ``[[streams]]`` of ``icefloe.toml``
become sources with one sink each. Afterwards the registry wins; a config whose streams
differ from it is reported (:func:`drift`), never applied silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Column, StreamConfig
from icefloe.errors import ConfigError, ManifestCorruptError
from icefloe.registry.model import Registry, Source
from icefloe.registry.ops import create_source, seed_specs
from icefloe.store.base import AsyncObjectStore
from icefloe.store.cas import CasStats, Versioned, cas_document, load_document
from icefloe.store.retry import RetryPolicy
from icefloe.streams.model import CdcConfig

DEFAULT_KEY = "registry/registry.json"


def _decode(data: bytes) -> Registry:
    try:
        return Registry.decode(data)
    except ValueError as exc:  # msgspec.DecodeError and a wrong format are ValueErrors
        raise ManifestCorruptError(f"the stream registry cannot be read: {exc}") from None


class RegistryStore:
    """Reads and changes one registry object (``key`` inside the store)."""

    def __init__(self, store: AsyncObjectStore, key: str = DEFAULT_KEY, *,
                 backoff: RetryPolicy | None = None, clock: Clock = SYSTEM) -> None:
        self.store = store
        self.key = key
        self.clock = clock
        """Times CAS backoff; changes made here (the seed) are stamped with it, and callers
        pass it to :mod:`icefloe.registry.ops` for theirs."""
        self.backoff = backoff or RetryPolicy(max_attempts=50, budget_s=30.0)
        self.stats = CasStats()

    async def load(self) -> Versioned[Registry]:
        return await load_document(self.store, self.key, _decode, Registry, clock=self.clock)

    async def read(self) -> Registry:
        return (await self.load()).value

    async def update(self, change: Callable[[Registry], Registry]) -> Registry:
        """Apply ``change`` atomically and return the registry it produced (the current one
        when ``change`` returns it unchanged). ``change`` may raise to refuse."""

        def mutate(doc: Versioned[Registry]) -> Registry | None:
            new = change(doc.value)
            return None if new is doc.value else new

        loaded, written = await cas_document(self.store, self.key, _decode, Registry, mutate,
                                             backoff=self.backoff, stats=self.stats,
                                             what="registry", clock=self.clock)
        return written if written is not None else loaded.value

    async def seed(self, streams: Sequence[StreamConfig], source: str | None) -> Registry:
        """Put the config's streams into an empty registry (in one version); a registry
        that has been written before is returned as it is."""

        def first(registry: Registry) -> Registry:
            if registry.version != 0 or not streams:
                return registry
            seeded = registry
            for spec in seed_specs([_placeheld(s) for s in streams]):
                seeded = create_source(seeded, spec, clock=self.clock)
            # one version for the whole seed, and the seeded sinks receive everything since
            # version 0: events accepted from the config before the registry existed
            typed = {s.name: s for s in streams if s.format != "json"}
            changes = {s.name: s.cdc for s in streams if s.cdc is not None}
            return Registry(version=1, updated_at=seeded.updated_at, seeded_from=source,
                            sources=tuple(_with_cdc(_typed(_since_the_start(s),
                                                           typed.get(s.id)), changes.get(s.id))
                                          for s in seeded.sources))

        return await self.update(first)


def _with_cdc(source: Source, cdc: CdcConfig | None) -> Source:
    """A seeded change stream's sink keeps its ``cdc`` settings (the admin API does not
    take them itself yet: only icefloe.toml declares change streams)."""
    if cdc is None:
        return source
    sinks = tuple(msgspec.structs.replace(s, cdc=cdc) for s in source.sinks)
    return msgspec.structs.replace(source, sinks=sinks)


def _since_the_start(source: Source) -> Source:
    sinks = tuple(msgspec.structs.replace(s, created_version=0, updated_version=1)
                  for s in source.sinks)
    return msgspec.structs.replace(source, sinks=sinks, created_version=0, updated_version=1)


def _typed(source: Source, stream: StreamConfig | None) -> Source:
    """A seeded source keeps its config stream's payload format and type (Protobuf, Avro):
    the admin API does not take typed sources itself yet, only icefloe.toml declares them.
    Its sinks keep the stream's columns (none yet for a schema registry subject's)."""
    if stream is None:
        return source
    sinks = tuple(msgspec.structs.replace(s, columns=stream.columns) for s in source.sinks)
    return msgspec.structs.replace(source, format=stream.format, schema=stream.schema,
                                   sinks=sinks)


def _placeheld(stream: StreamConfig) -> StreamConfig:
    """A subject stream has no columns until its subject is read
    (:mod:`icefloe.registry.subjects`); the sink checks of seeding see one stand-in column,
    which :func:`_typed` removes again."""
    if stream.columns or stream.schema is None or not stream.schema.subject:
        return stream
    return msgspec.structs.replace(stream, columns=(Column("subject_pending", "string"),))


def refuse_conflicts(registry: Registry, streams: Sequence[StreamConfig], where: str) -> None:
    """Refuse a config stream (``[[streams]]`` or an events file) whose table a registry
    source of *another* id writes: two declarations of one table, and which one's columns
    the events are validated against would depend on the order things started in.
    Other differences are drift (:func:`drift`): the registry's declaration is used.

    Raises:
        ConfigError: naming the config stream and the registry source.
    """
    writers = {sink.table: source.id for source in registry.live_sources()
               for sink in source.live_sinks()}
    for stream in streams:
        writer = writers.get(stream.table)
        if writer is not None and writer != stream.name:
            raise ConfigError(
                f"{where}: stream {stream.name!r} of the config and source {writer!r} of the "
                f"registry both write table {stream.table}; keep one: remove the stream from "
                f"the config, or delete the source (`icefloe sources delete {writer}`)")


def drift(registry: Registry, streams: Sequence[StreamConfig]) -> list[str]:
    """How the config's streams differ from the registry (empty: they agree). Reported at
    start: after seeding, the registry is the truth and the file is only a seed."""
    notes: list[str] = []
    for stream in streams:
        source = registry.source(stream.name)
        if source is None:
            notes.append(f"stream {stream.name!r} is in the config but not in the registry "
                         "(deleted there, or never added): create it with `icefloe sources "
                         "create`")
            continue
        sink = next((s for s in source.live_sinks() if s.table == stream.table), None)
        if sink is None:
            notes.append(f"stream {stream.name!r}: no sink of the registry's source writes "
                         f"{stream.table}")
        elif sink.columns != stream.columns:
            notes.append(f"stream {stream.name!r}: its columns differ from sink "
                         f"{sink.name!r} in the registry (the registry's are used)")
    configured = {s.name for s in streams}
    for source in registry.live_sources():
        if source.id not in configured:
            notes.append(f"source {source.id!r} exists in the registry only (added at "
                         "runtime)")
    return notes
