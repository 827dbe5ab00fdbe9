"""An OTLP export request through icefloe's one admission path, for both transports.

One request becomes rows of one or more kinds (:mod:`icefloe.otlp.rows`: logs, spans, or
the five kinds of metric points), each kind a stream the ``[otlp]`` section generates. The
steps, in the order that keeps refusals cheap and whole:

1. **Before the body** (:meth:`OtlpAdmission.authorize`): the token against every stream of
   the signal, and the rate limits' prechecks. A missing token is refused (401 /
   UNAUTHENTICATED) unless one of them is open; a token no stream takes, 403 /
   PERMISSION_DENIED. What each stream answered is kept for step 3.
2. **Rows**: the decoded request becomes rows; records and points that cannot become rows
   are counted (``partial_success``), never silently dropped.
3. **Every kind validated, then every kind buffered** (:meth:`OtlpAdmission.admit`): a
   stream the token may not write refuses the request; a row its stream refuses refuses
   the request (400), before anything is buffered, so a refused request leaves nothing.
4. **Durable** (:meth:`Admitted.settle`): the answer waits for every kind's flush.

Why the event ids: row ``i`` of kind ``k`` gets ``otlp:<k>:<32 hex of sha256(body)>:<i>``.
An exporter retries a request whose answer it did not get with the same bytes, so the retry
carries the same ids, on any ingestor, after any restart, and the collector's dedup window
(``collector.dedup_window_s``) keeps one copy. Two byte-identical requests are therefore
one request: a second identical export within the window is absorbed as a retry (exporters
never send one: a request holds timestamps). If buffering a later kind is refused (a full
buffer, a rate limit) after an earlier kind was buffered, the request is refused with the
retriable answer and the earlier kind's rows, if they become durable, are deduplicated when
the exporter retries.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from google.protobuf.message import Message

from icefloe.config import Config
from icefloe.otlp.config import otlp_stream_names, otlp_streams
from icefloe.otlp.kinds import SIGNAL_KINDS
from icefloe.otlp.rows import ExportRows, export_rows
from icefloe.otlp.wire import wire_rows
from icefloe.streams.model import StreamConfig
from ingestor.errors import (
    BadRequest,
    IngestError,
    NotFoundRoute,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    UnknownStream,
)
from ingestor.otlp.decode import Signal, parse_protobuf
from ingestor.service import Caller, IngestService
from ingestor.validate import Canonical, CompiledStream, InvalidEvents

__all__ = ["Admitted", "Authorized", "OtlpAdmission", "event_id_stem"]

ID_PREFIX: Final = "otlp"
_SUFFIXES: Final = tuple(b"%d" % i for i in range(4096))


def event_id_stem(kind: str, body: bytes) -> bytes:
    """``otlp:<kind>:<first 32 hex of sha256(body)>:``, the stem of a request's ids (the
    row's index within its kind follows)."""
    return f"{ID_PREFIX}:{kind}:{hashlib.sha256(body).hexdigest()[:32]}:".encode()


def _suffixes(count: int) -> Sequence[bytes]:
    if count <= len(_SUFFIXES):
        return _SUFFIXES
    return [b"%d" % i for i in range(count)]


@dataclass
class Authorized:
    """What each stream of a signal said to the request's token: its caller, or why not."""

    callers: dict[str, Caller] = field(default_factory=dict)
    refusals: dict[str, IngestError] = field(default_factory=dict)


@dataclass
class Admitted:
    """A request's rows in the buffer: one durability future per kind, and what to answer."""

    futures: list[asyncio.Future[None]]
    counts: dict[str, int]
    """Rows per stream name (counted as accepted once everything is durable)."""
    rejected: int
    message: str

    async def settle(self, service: IngestService) -> None:
        """Wait for every kind's flush; raise the first failure (nothing is acknowledged
        unless every kind is durable)."""
        outcomes = await asyncio.gather(*self.futures, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        for stream, count in self.counts.items():
            service.accepted(stream, count)


class OtlpAdmission:
    """The OTLP admission of one ingestor (both transports share it)."""

    def __init__(self, service: IngestService, config: Config) -> None:
        self.service = service
        section = config.otlp
        self.enabled = bool(section.enabled)
        self.streams: dict[str, str] = otlp_stream_names(section) if self.enabled else {}
        """Kind -> the generated stream's name."""
        self.generated: dict[str, StreamConfig] = {
            s.name: s for s in otlp_streams(section, "otlp")} if self.enabled else {}
        """Stream name -> the stream the ``[otlp]`` section generates (its rows can be made
        in canonical form directly, see :meth:`rows`)."""

    def kinds(self, signal: str) -> list[str]:
        """The kinds of ``signal`` this ingestor takes.

        Raises:
            NotFoundRoute: 404 / UNIMPLEMENTED: ``[otlp]`` is off, or ``otlp.kinds`` leaves
                every kind of the signal out.
        """
        if not self.enabled:
            raise NotFoundRoute(f"OTLP {signal} are not received here: this ingestor's [otlp] "
                                "section is off; set [otlp] enabled = true (docs/otlp.md)",
                                code="otlp_disabled")
        kinds = [kind for kind in SIGNAL_KINDS[signal] if kind in self.streams]
        if not kinds:
            raise NotFoundRoute(f"OTLP {signal} are not received here: otlp.kinds leaves "
                                f"{', '.join(SIGNAL_KINDS[signal])} out", code="otlp_disabled")
        return kinds

    def _stream(self, kind: str) -> CompiledStream:
        name = self.streams[kind]
        try:
            return self.service.stream(name)
        except UnknownStream:  # the stream registry serves other streams than the config
            raise UnknownStream(f"OTLP {kind} rows go to stream {name!r}, which this "
                                "ingestor does not serve: the stream registry in use has no "
                                "such source; add it (icefloe sources) or remove the "
                                "registry's sources that replaced the config's streams"
                                ) from None

    def labels(self, signal: str) -> list[str]:
        """The stream names of ``signal``'s kinds (metrics labels)."""
        return [self.streams[kind] for kind in SIGNAL_KINDS[signal] if kind in self.streams]

    async def authorize(self, signal: str, token: str | None, client: str | None
                        ) -> Authorized:
        """Step 1 (see top): the token against every stream of ``signal``.

        Raises:
            Unauthenticated, PermissionDenied: no stream of the signal takes the request.
            Overloaded: a rate limit's bucket is empty, or tokens are being verified.
        """
        found = Authorized()
        for kind in self.kinds(signal):
            stream = self._stream(kind)
            try:
                found.callers[kind] = await self.service.authorize(stream, token, client)
            except (Unauthenticated, PermissionDenied) as refused:
                found.refusals[kind] = refused
        if not found.callers:
            raise _first_refusal(found.refusals, token)
        return found

    def rows(self, signal: str, request: Message) -> ExportRows:
        """Step 2: the request's rows per kind.

        Why canonical when every stream of the signal is still the generated one: the rows
        are then made in exactly the bytes the stream's validation would give back (tested
        byte for byte for every kind), and validating them again was half the cost of a
        request. A stream registry may serve an ``otlp.*`` source of its own: its rows go
        through its validation like any client's."""
        return export_rows(signal, request, canonical=self._canonical(signal))

    def protobuf_rows(self, signal: Signal, body: bytes) -> ExportRows:
        """Step 2 from a binary protobuf body: the compiled decoder's rows
        (:func:`icefloe.otlp.wire.wire_rows`, the same bytes as :meth:`rows` at a fifth of
        the cost) when the rows may be canonical and it can read the body; else the
        reference path's, which also refuses what is not a request (``invalid_protobuf``).

        Raises:
            BadRequest: the body is not a valid export request of ``signal``.
        """
        if self._canonical(signal.name):
            found = wire_rows(signal.name, body)
            if found is not None:
                return found
        return self.rows(signal.name, parse_protobuf(signal, body))

    def _canonical(self, signal: str) -> bool:
        return all(self._generated_here(kind) for kind in self.kinds(signal))

    def _generated_here(self, kind: str) -> bool:
        name = self.streams[kind]
        try:
            return self.service.stream(name).config == self.generated.get(name)
        except UnknownStream:
            return False

    def _fitting(self, kind: str, canonical: Canonical
                 ) -> tuple[Canonical, Sequence[bytes], str]:
        """``canonical`` without the rows over ``max_event_bytes``, the id suffix of each
        row kept (its index in the kind, as always), and the partial-success message for
        those left out ('' when none). Why here and not the service's refusal: that one
        refuses a whole request, and an export whose kinds are buffered one by one would
        be stored in part although its answer says it failed; OTLP counts a record it
        cannot take in ``partial_success`` instead."""
        limit = self.service.max_event_bytes
        payloads = canonical.payloads
        if not payloads or max(map(len, payloads)) <= limit:
            return canonical, _suffixes(len(payloads)), ""
        over = [(i, len(p)) for i, p in enumerate(payloads) if len(p) > limit]
        keep = [i for i, p in enumerate(payloads) if len(p) <= limit]
        fitting = canonical._replace(
            payloads=[payloads[i] for i in keep],
            body_ids=None if canonical.body_ids is None
            else [canonical.body_ids[i] for i in keep],
            schema_ids=None if canonical.schema_ids is None
            else [canonical.schema_ids[i] for i in keep])
        return fitting, [b"%d" % i for i in keep], _over_limit(kind, over, limit)

    def admit(self, rows: ExportRows, body: bytes, authorized: Authorized) -> Admitted:
        """Step 3 (see top): validate every kind's rows, then buffer them with derived ids.

        Raises:
            Unauthenticated, PermissionDenied: a stream the rows go to refused the token.
            BadRequest: rows a stream does not take (nothing is buffered).
            IngestError: a buffering refusal (full buffer, rate limit, store down).
        """
        prepared = []
        rejected, message = rows.rejected, rows.message
        for kind, kind_rows in rows.rows.items():
            if not kind_rows:
                continue
            if kind not in self.streams:  # otlp.kinds leaves it out: said, never dropped
                why = f"{len(kind_rows)} {kind} data point(s) refused: otlp.kinds leaves " \
                    f"{kind} out"
                message = f"{message}; {why}" if message else why
                rejected += len(kind_rows)
                continue
            if kind in authorized.refusals:
                raise authorized.refusals[kind]
            stream = self._stream(kind)
            if rows.canonical:
                if stream.config != self.generated.get(stream.name):
                    raise Unavailable(f"stream {stream.name!r} changed while this request "
                                      "was read (a registry update); retry it",
                                      retry_after_s=1)
                prepared.append((kind, stream, Canonical(kind_rows, None)))
                continue
            try:
                canonical = stream.from_events(kind_rows)
            except InvalidEvents as exc:
                raise BadRequest(f"the {kind} rows of this request do not fit stream "
                                 f"{stream.name!r}: {exc}", code=exc.code,
                                 details=[v.as_dict() for v in exc.violations]) from None
            prepared.append((kind, stream, canonical))
        admitted = Admitted([], {}, rejected, message)
        checked = []
        for kind, stream, canonical in prepared:  # before anything is buffered
            fitting, suffixes, why = self._fitting(kind, canonical)
            if why:
                admitted.rejected += len(canonical.payloads) - len(fitting.payloads)
                admitted.message = f"{admitted.message}; {why}" if admitted.message else why
            if fitting.payloads:
                checked.append((kind, stream, fitting, suffixes))
        try:
            for kind, stream, canonical, suffixes in checked:
                count = len(canonical.payloads)
                admitted.futures.append(self.service.admit(
                    stream, canonical, caller=authorized.callers.get(kind),
                    derived_ids=(event_id_stem(kind, body), suffixes)))
                admitted.counts[stream.name] = count
        except BaseException:
            for future in admitted.futures:  # buffered already: durable or not, unanswered
                future.add_done_callback(_retrieve)
            raise
        return admitted


def _over_limit(kind: str, sizes: list[tuple[int, int]], limit: int) -> str:
    """The partial-success message for rows over ``max_event_bytes``."""
    index, size = sizes[0]
    return (f"{len(sizes)} {kind} row(s) refused: over ingestor.max_event_bytes ({limit}) "
            f"as a row, the first is {kind} row {index} ({size} bytes); the others of the "
            "request are stored")


def _first_refusal(refusals: dict[str, IngestError], token: str | None) -> IngestError:
    """401 when no token came (and one is needed), else the first refusal (403)."""
    errors = list(refusals.values())
    if token is None:
        return next((e for e in errors if isinstance(e, Unauthenticated)), errors[0])
    return next((e for e in errors if isinstance(e, PermissionDenied)), errors[0])


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
