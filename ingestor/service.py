"""The transport-independent ingest service shared by the HTTP and gRPC fronts.

Why a separate layer: both fronts must validate, authorize, assign event ids, enforce
limits and wait for durability in exactly the same way; they only differ in how bytes
arrive and how errors are spelled. Everything here is plain asyncio with no web framework.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.errors import NotFound, StoreError
from icefloe.formats.envelope import MAX_ID_BYTES, frame_encoded, frame_typed
from icefloe.registry.model import Registry
from icefloe.registry.streams import effective_config
from icefloe.registry.subjects import SubjectError, is_subject_stream, resolve_stream
from icefloe.schemas.model import SchemaDocument
from icefloe.store.base import AsyncObjectStore
from icefloe.streams.invalid import invalid_payload, invalid_stream
from icefloe.streams.model import StreamConfig
from ingestor.auth import Credential, TokenAuthority
from ingestor.buffer import Batcher
from ingestor.client_address import TrustedProxies
from ingestor.client_errors import ClientErrorLog, is_client_error
from ingestor.errors import (
    BadRequest,
    IngestError,
    PayloadTooLarge,
    UnknownStream,
)
from ingestor.metrics import IngestMetrics
from ingestor.ratelimit import RateLimiter
from ingestor.ulids import UlidSource
from ingestor.validate import Canonical, CompiledStream, InvalidEvents, with_client
from ingestor.writer_schemas import WriterSchemas

READY_CACHE_S = 1.0
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters and DEL: refused in event ids and idempotency keys, which
end up in logs, in dedup keys and in other systems' keys, where they mislead or break."""
log = logging.getLogger("icefloe.ingestor")


class Caller(NamedTuple):
    """Who sent a request: the client address (after trusted proxies; None if unknown) and
    the name of the token that authorized it (None on an open stream). Never the token.

    A NamedTuple rather than a frozen dataclass: one is built per request, at a third of
    the cost."""

    client: str | None = None
    token: str | None = None


class IngestService:
    """Authorize → validate → rate-limit → id → frame → buffer → wait until durable."""

    def __init__(self, config: Config, batcher: Batcher, metrics: IngestMetrics,
                 store: AsyncObjectStore, clock: Clock = SYSTEM) -> None:
        self.config = config
        self.client_errors = ClientErrorLog(metrics.client_errors,
                                            metrics.client_error_logs_suppressed, clock=clock)
        self.batcher = batcher
        self.metrics = metrics
        self.store = store
        self._clock = clock
        self.max_event_bytes = config.ingestor.max_event_bytes
        self._ready: tuple[float, bool, str] = (0.0, False, "not checked yet")
        self._accepted: dict[str, Any] = {}
        self.proxies = TrustedProxies(config.ingestor.trusted_proxies,
                                      config.ingestor.forwarded_header)
        self.registry_version = 0
        self._ulids = UlidSource()
        self.writer_schemas = WriterSchemas(store, config.admin.registry_key, clock=clock)
        """Avro writer schemas of the schema registry (Confluent-framed records), and the
        ids single-object records are stored with."""
        self.writer_schemas.on_document = self._schemas_read
        self._served: tuple[Config, int, dict[str, str]] | None = None
        self._subjects: dict[str, tuple[StreamConfig, str | None]] = {}
        """Each subject stream as last resolved, and why it has no type (None: it has)."""
        self._use(config, 0, {s.table: s.name for s in config.streams})

    def _use(self, config: Config, version: int, tables: dict[str, str]) -> None:
        """Serve ``config``'s streams from now on (built fully before being swapped in, so
        a request sees either the old or the new set, never a mix)."""
        self._served = (config, version, tables)
        streams = {s.name: self._compiled(s, version) for s in config.streams}
        by_table = {t: streams[name] for t, name in tables.items() if name in streams}
        auth = TokenAuthority(config, clock=self._clock)
        limits = RateLimiter(config, self.metrics, clock=self._clock.monotonic)
        earlier: tuple[TokenAuthority, RateLimiter] | None = getattr(self, "_serving", None)
        if earlier is not None:  # what still holds is kept (see the two carry methods)
            auth.carry(earlier[0])
            limits.carry(earlier[1])
        self._serving = (auth, limits)
        self.streams, self._by_table, self.auth, self.limits = streams, by_table, auth, limits
        self.registry_version = version
        self.metrics.registry_version.set(version)

    def _compiled(self, stream: StreamConfig, version: int) -> CompiledStream:
        """``stream`` ready to serve; a subject stream resolved from the registry document
        last read (:mod:`icefloe.registry.subjects`)."""
        problem: str | None = None
        if is_subject_stream(stream):
            stream, problem = self._resolve(stream)
            self._subjects[stream.name] = (stream, problem)
            if problem:
                log.warning("%s", problem)
        return CompiledStream(stream, version, clock=self._clock, writers=self.writer_schemas,
                              subject_problem=problem)

    def _resolve(self, stream: StreamConfig) -> tuple[StreamConfig, str | None]:
        doc = self.writer_schemas.document
        if doc is None:
            return stream, None  # not read yet: 503 until it is
        try:
            return resolve_stream(stream, doc, self.writer_schemas.parser), None
        except SubjectError as exc:
            if exc.missing:
                return stream, None  # 503 until its producer registers it
            return stream, str(exc)

    def _schemas_read(self, doc: SchemaDocument) -> None:
        """The registry document was read again: re-build each subject stream whose
        resolution changed (a new version: its new type serves from now on)."""
        if self._served is None or not self._subjects:
            return
        config, version, _ = self._served
        streams = dict(self.streams)
        changed = []
        for stream in config.streams:
            before = self._subjects.get(stream.name)
            if before is None or stream.name not in streams:
                continue
            if self._resolve(stream) != before:
                streams[stream.name] = self._compiled(stream, version)
                changed.append(stream.name)
        if changed:
            by_table = {t: streams[s.name] for t, s in self._by_table.items()}
            self.streams, self._by_table = streams, by_table
            log.info("schema registry version %d: subject streams %s re-resolved",
                     doc.version, ",".join(changed))

    def apply_registry(self, registry: Registry) -> None:
        """Switch to a new registry version: its live sources become the streams, their
        tokens and rate limits apply at once (a rotated-out token is refused from now on)."""
        tables = {sink.table: source.id for source in registry.live_sources()
                  for sink in source.live_sinks()}
        self._use(effective_config(self.config, registry), registry.version, tables)
        log.info("registry version %d: streams %s", registry.version,
                 ",".join(self.streams) or "-", extra={"registry_version": registry.version})

    async def own_writers(self) -> None:
        """Keep every served Avro stream's schema in the schema registry document (the id
        its single-object records are stored with), so the first such record need not be
        answered 503 while it is written; a store error is logged, and those records are
        refused (503) until a later try keeps it."""
        for stream in list(self.streams.values()):
            if stream.typed is None:
                continue
            try:
                await stream.typed.own_writer()
            except Exception as exc:
                log.warning("stream %s: cannot keep its Avro schema in the schema registry "
                            "document: %s", stream.name, exc)

    # -- lookups ---------------------------------------------------------------------------

    def stream(self, name: str) -> CompiledStream:
        try:
            return self.streams[name]
        except KeyError:  # do not list the configured streams to unauthenticated callers
            raise UnknownStream(f"unknown stream {name!r}: check the stream name in the URL "
                                "or request") from None

    def stream_for_table(self, namespace: str, table: str) -> CompiledStream:
        try:
            return self._by_table[f"{namespace}.{table}"]
        except KeyError:
            raise UnknownStream(f"no stream writes table {namespace}.{table}") from None

    async def authorize(self, stream: CompiledStream, token: str | None,
                        client: str | None = None) -> Caller:
        """Check the token (:mod:`ingestor.auth`) and that the rate limits have room.

        Runs before any body is read: an empty bucket refuses at once (429), and a client
        over its own limit cannot make the ingestor verify new tokens for it.

        Raises:
            Unauthenticated, PermissionDenied: missing / wrong token.
            Overloaded: ``rate_limited`` or ``auth_busy``.
        """
        if self.limits.enabled:
            self.limits.precheck_client(stream.name, client)
        credential = await self.auth.authorize(stream.name, token, client)
        return self._caller(stream, credential, client)

    def authorize_known(self, stream: CompiledStream, token: str | None,
                        client: str | None = None) -> Caller:
        """:meth:`authorize` without awaiting (the HTTP fast lane).

        Raises:
            NeedsVerification: a first-time token, which only :meth:`authorize` can verify.
            Unauthenticated, PermissionDenied, Overloaded: as :meth:`authorize`.
        """
        if self.limits.enabled:
            self.limits.precheck_client(stream.name, client)
        return self._caller(stream, self.auth.authorize_known(stream.name, token), client)

    def _caller(self, stream: CompiledStream, credential: Credential | None,
                client: str | None) -> Caller:
        caller = Caller(client, None if credential is None else credential.name)
        if self.limits.enabled:
            self.limits.admit(stream.name, caller.token, client, 1, 1, take=False)
        return caller

    # -- ingest ----------------------------------------------------------------------------

    def reject(self, stream: str, error: IngestError, events: int = 1) -> None:
        """Count refused events by reason (the fronts call this for every refusal).

        Only configured stream names become label values, never client input.
        """
        label = stream if stream in self.streams else "-"
        self.metrics.events_rejected.labels(label, error.code).inc(max(events, 1))
        if is_client_error(error):
            self.client_errors.record(label, error)

    @staticmethod
    def bad_request(exc: InvalidEvents) -> BadRequest:
        return BadRequest(str(exc), code=exc.code,
                          details=[v.as_dict() for v in exc.violations])

    async def ingest(self, stream: CompiledStream, canonical: Canonical, *,
                     event_ids: Sequence[str] | None = None,
                     idempotency_key: str | None = None, caller: Caller | None = None,
                     meta: bytes = b"") -> int:
        """Make the events durable; return how many were accepted (all or none).

        ``caller`` (from :meth:`authorize`) selects the token and client rate limits; the
        stream's own limit applies either way. ``meta`` (from
        :meth:`CompiledStream.request_meta`) goes into every record's envelope.
        """
        await self.admit(stream, canonical, event_ids=event_ids,
                         idempotency_key=idempotency_key, caller=caller, meta=meta)
        return self.accepted(stream.name, len(canonical.payloads))

    def admit(self, stream: CompiledStream, canonical: Canonical, *,
              event_ids: Sequence[str] | None = None, idempotency_key: str | None = None,
              caller: Caller | None = None, meta: bytes = b"",
              metas: Sequence[bytes] | None = None,
              derived_ids: tuple[bytes, Sequence[bytes]] | None = None
              ) -> asyncio.Future[None]:
        """:meth:`ingest` up to the wait: check, id, frame and buffer the events; the
        returned future resolves once they are durable (then call :meth:`accepted`).

        Why separate: a front that answers from a callback (the HTTP fast lane) needs no
        task per request. Raises every refusal :meth:`ingest` raises before the wait.
        ``metas``: one envelope meta per event instead of ``meta`` for all (the Kafka
        listener's record metadata, :mod:`ingestor.kafka.produce`). ``derived_ids``: the
        events' ids as a UTF-8 stem and a suffix each, already checked (the Kafka listener's
        sequence ids); a body id field still wins over them.
        """
        payloads = canonical.payloads
        if not payloads:  # the decoders refuse this first; never frame an empty request
            raise BadRequest("the request holds no events", code="empty_body")
        if max(map(len, payloads)) > self.max_event_bytes:
            self._too_large(payloads)
        if stream.keeps_unknown and caller is not None and caller.token:
            payloads = with_client(payloads, caller.token)  # evolution quotas' client
        received_at_ms = int(self._clock.time() * 1000)
        if derived_ids is not None and not canonical.body_ids:
            stem, ids = derived_ids
        else:
            if derived_ids is not None:
                event_ids = [(derived_ids[0] + s).decode() for s in derived_ids[1]]
            stem, ids = self._event_ids(len(payloads), canonical.body_ids, event_ids,
                                        idempotency_key, received_at_ms)
        if self.limits.enabled:
            self.limits.admit(stream.name, caller.token if caller else None,
                              caller.client if caller else None, len(payloads),
                              sum(map(len, payloads)))
        if metas is not None:
            framed = _frame_each(stream.name, received_at_ms, stem, ids, payloads, canonical,
                                 metas)
        elif canonical.format:  # a typed stream's binary payloads: envelope version 2
            framed = frame_typed(stream.name, received_at_ms, ids, payloads, canonical.format,
                                 canonical.schema_ids or [0] * len(payloads), meta=meta,
                                 stem=stem)
        else:
            framed = frame_encoded(stream.name, received_at_ms, ids, payloads, meta=meta,
                                   stem=stem)
        return self.batcher.enqueue(framed, len(payloads), stream.name,
                                    stream.registry_version)

    def admit_valid(self, stream: CompiledStream, events: Sequence[bytes], *,
                    event_ids: Sequence[str] | None = None,
                    idempotency_key: str | None = None, caller: Caller | None = None,
                    meta: bytes = b"") -> tuple[asyncio.Future[None], int, int]:
        """``on_invalid = "dead_letter"``, after a request failed validation: buffer its
        valid events for the stream and its invalid ones as dead letters, in one enqueue
        (one batch, so one durability outcome for both); returns the future and the
        counts ``(accepted, dead_lettered)``.

        Why ids by the event's place in the request: a retried request (same idempotency
        key or ids) gives every event, valid or not, the id it had the first time, so the
        valid ones are deduplicated as always and each dead letter keeps one identity.
        Every other refusal (rate limits, sizes, ids, a full buffer) still refuses the
        whole request, as without the setting.
        """
        kept, canonical, bad = stream.split_invalid(events)
        count = len(events)
        payloads = canonical.payloads
        if payloads and max(map(len, payloads)) > self.max_event_bytes:
            self._too_large(payloads)
        if stream.keeps_unknown and caller is not None and caller.token and payloads:
            payloads = with_client(payloads, caller.token)
        received_at_ms = int(self._clock.time() * 1000)
        body_ids: list[str | None] | None = None
        if canonical.body_ids:
            body_ids = [None] * count
            for index, event_id in zip(kept, canonical.body_ids, strict=True):
                body_ids[index] = event_id
        stem, raw_ids = self._event_ids(count, body_ids, event_ids, idempotency_key,
                                        received_at_ms)
        ids = [stem + raw_ids[i] for i in range(count)]
        if self.limits.enabled:
            self.limits.admit(stream.name, caller.token if caller else None,
                              caller.client if caller else None, count,
                              sum(map(len, payloads)) + sum(len(events[i]) for i, _ in bad))
        framed = b""
        if payloads:
            framed = frame_encoded(stream.name, received_at_ms, [ids[i] for i in kept],
                                   payloads, meta=meta)
        dead = [invalid_payload(why.code, why.field, why.reason, events[index])
                for index, why in bad]
        if dead:
            framed += frame_encoded(invalid_stream(stream.name), received_at_ms,
                                    [ids[index] for index, _ in bad], dead)
        future = self.batcher.enqueue(framed, count, stream.name, stream.registry_version,
                                      also=(invalid_stream(stream.name),) if dead else ())
        if dead:
            self.metrics.events_dead_lettered.labels(stream.name).inc(len(dead))
        return future, len(payloads), len(dead)

    def _too_large(self, payloads: Sequence[bytes]) -> NoReturn:
        index = next(i for i, p in enumerate(payloads) if len(p) > self.max_event_bytes)
        size = len(payloads[index])
        raise PayloadTooLarge(
            f"event {index} is {size} bytes, over the {self.max_event_bytes}-byte limit per "
            "event (ingestor.max_event_bytes)", code="event_too_large",
            details=[{"index": index, "field": None,
                      "reason": f"{size} bytes > {self.max_event_bytes}"}])

    def accepted(self, stream: str, count: int) -> int:
        """Count ``count`` durable events of ``stream``; returns ``count``."""
        accepted = self._accepted.get(stream)
        if accepted is None:  # labels() takes a lock: cache the child per stream
            accepted = self._accepted[stream] = self.metrics.events_accepted.labels(stream)
        accepted.inc(count)
        return count

    def _event_ids(self, count: int, body_ids: Sequence[str | None] | None,
                   explicit: Sequence[str] | None, key: str | None, now_ms: int
                   ) -> tuple[bytes, Sequence[bytes]]:
        """Body id field > per-event id > idempotency key (+ index) > generated; UTF-8, as
        a stem and what follows it per event (:func:`frame_encoded`'s ``stem``/``raw_ids``).

        Why bytes: the framing needs them encoded. Why a stem: derived ids (a key or a ULID
        plus ``:i``/``-i``) are never built one by one — the framing writes the stem and a
        cached suffix per index."""
        raw_key = None
        if key is not None:
            raw_key = key.encode()
            if not 0 < len(raw_key) <= MAX_ID_BYTES - 11:
                raise BadRequest(f"the idempotency key must be 1..{MAX_ID_BYTES - 11} bytes",
                                 code="invalid_idempotency_key")
            if _CONTROL.search(key) is not None:
                raise BadRequest("the idempotency key (Idempotency-Key header, gRPC "
                                 "request_id) holds a control character",
                                 code="invalid_idempotency_key",
                                 details=[{"index": None, "field": "idempotency_key",
                                           "reason": "control character"}])
        if not body_ids and not explicit:  # the common case: every id derived, all valid
            if raw_key is not None:  # 11 bytes of room above hold ":" and any index
                return (b"", [raw_key]) if count == 1 else (raw_key, _suffixes(b":", count))
            return self._ulids.next(now_ms).encode(), _suffixes(b"-", count)
        _refuse_control_ids(body_ids)
        _refuse_control_ids(explicit)
        generated: bytes | None = None
        ids: list[bytes] = []
        for index in range(count):
            event_id = body_ids[index] if body_ids else None
            if not event_id and explicit:
                event_id = explicit[index] or None
            if event_id:
                raw = event_id.encode()
            elif raw_key is not None:
                raw = raw_key if count == 1 else raw_key + b":%d" % index
            else:
                if generated is None:
                    generated = self._ulids.next(now_ms).encode()
                raw = generated + b"-%d" % index
            if not 0 < len(raw) <= MAX_ID_BYTES:
                raise BadRequest(
                    f"event {index}: its id is {len(raw)} bytes; ids must be "
                    f"1..{MAX_ID_BYTES} UTF-8 bytes", code="invalid_event_id",
                    details=[{"index": index, "field": "event_id",
                              "reason": f"id {event_id[:40]!r}... longer than {MAX_ID_BYTES} "
                                        "bytes" if event_id and len(event_id) > 40
                              else "id too long"}])
            ids.append(raw)
        return b"", ids

    # -- readiness -------------------------------------------------------------------------

    async def ready(self) -> tuple[bool, str]:
        """Store reachable and config loaded (cached for a second to keep probes cheap)."""
        checked, ok, reason = self._ready
        if self._clock.monotonic() - checked < READY_CACHE_S:
            return ok, reason
        try:
            await asyncio.wait_for(self.store.head(self.config.manifest.key), 5.0)
            ok, reason = True, "ok"
        except NotFound:
            ok, reason = True, "ok (no manifest yet)"
        except (StoreError, TimeoutError) as exc:  # details go to the log, not to callers
            log.warning("readiness check failed: %s", exc)
            ok, reason = False, "object store unreachable"
        self._ready = (self._clock.monotonic(), ok, reason)
        return ok, reason


def _frame_each(stream: str, received_at_ms: int, stem: bytes, raw_ids: Sequence[bytes],
                payloads: Sequence[bytes], canonical: Canonical, metas: Sequence[bytes]
                ) -> bytes:
    """Each event framed with its own meta (Kafka records each carry their key, headers,
    partition, offset and timestamp): one framing call per event, so only streams that map
    Kafka metadata pay it."""
    if len(metas) != len(payloads):
        raise ValueError(f"{len(metas)} metas for {len(payloads)} payloads")
    parts = []
    for index, payload in enumerate(payloads):
        event_id = [stem + raw_ids[index]]
        if canonical.format:
            schema = canonical.schema_ids[index] if canonical.schema_ids else 0
            parts.append(frame_typed(stream, received_at_ms, event_id, [payload],
                                     canonical.format, [schema], meta=metas[index]))
        else:
            parts.append(frame_encoded(stream, received_at_ms, event_id, [payload],
                                       meta=metas[index]))
    return b"".join(parts)


def _refuse_control_ids(ids: Sequence[str | None] | None) -> None:
    """Refuse ids holding control characters; one search over all of them (the common case
    finds none), the index only looked for when one does."""
    if not ids or _CONTROL.search("".join(filter(None, ids))) is None:
        return
    bad = [index for index, event_id in enumerate(ids)
           if event_id and _CONTROL.search(event_id) is not None]
    raise BadRequest(f"{len(bad)} event id(s) hold a control character; nothing was accepted",
                     code="invalid_event_id",
                     details=[{"index": index, "field": "event_id",
                               "reason": "control character"} for index in bad[:100]])


_SUFFIX_CACHE = 1024
_SUFFIXES: dict[bytes, tuple[bytes, ...]] = {
    sep: tuple(sep + b"%d" % i for i in range(_SUFFIX_CACHE)) for sep in (b"-", b":")}


def _suffixes(sep: bytes, count: int) -> Sequence[bytes]:
    """``sep + index`` for each index below ``count`` (cached up to 1024; the cached tuple
    is returned whole, its first ``count`` are the ones)."""
    if count <= _SUFFIX_CACHE:
        return _SUFFIXES[sep]
    return [sep + b"%d" % i for i in range(count)]
