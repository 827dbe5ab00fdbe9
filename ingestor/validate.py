"""Compile a stream's declared columns into a fast validator that emits canonical payloads.

Why msgspec structs built at start-up: decoding a request straight into a typed struct
validates every field while parsing (measured ~1.5 M events/s per core for 100-event
arrays, including re-encoding), with no Python dict per event. Re-encoding the struct gives
the **canonical payload** the collector relies on: minified JSON holding only declared
fields, timestamps as RFC 3339 UTC (epoch-millisecond inputs converted), ``json`` columns
as JSON text. The collector can then parse a whole batch of one stream in one columnar
``pyarrow.json.read_json`` pass.

Validation errors are collected per event (index, field, reason): the fast path decodes the
whole body at once; only when it fails does a slow path decode event by event to report
every bad event, so a valid request never pays for error reporting. What each column type
accepts, and the canonical form of a value, is the core's (:mod:`icefloe.streams.types`):
the config checks mapping defaults with the same rules.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import IcefloeError
from icefloe.formats.speedups import compiled as _speedups
from icefloe.streams.cdc import Flattener
from icefloe.streams.entries import entry_payload
from icefloe.streams.evolution import CLIENT_FIELD, EXTRA_FIELD
from icefloe.streams.mappings import parse_path
from icefloe.streams.model import Column, StreamConfig
from icefloe.streams.native import Normalizer, field_type, normalizer
from icefloe.streams.types import (
    EPOCH,
    FIELD_TYPES,
    MAX_EPOCH_MS,
    MAX_JSON_DEPTH,
    OutOfRange,
    convert_value,
    json_text,
)
from icefloe.typed.codec import TypedPayloadError
from ingestor.changes import flatten_events
from ingestor.errors import UnsupportedMediaType
from ingestor.mappings import EventMappings, MappingViolation, request_meta
from ingestor.typed import BadPayloads, TypedDoor, event_ids, split_delimited
from ingestor.writer_schemas import WriterSchemas

RECEIVED_AT = "received_at"
"""An unmapped ``timestamp`` column of this name is filled with the receive time when an
event leaves it out or sends null (what OndatraSQL's event tables do); a sent value wins."""
_SHORT_JSON = 2 * MAX_JSON_DEPTH
_LOWER_E, _UPPER_E = ord("e"), ord("E")  # ``int in bytes`` is a memchr, ~9x ``b"e" in``
"""JSON text this short cannot nest deeper than the limit nor hold 309 digits: without an
``e``/``E`` (an exponent) it needs no check at all (nearly every value, at ~0.1 µs)."""
_AT = re.compile(r"^(?P<reason>.*?)(?: - at `\$(?:\[\d+\])?\.?(?P<path>[^`]*)`)?$", re.S)
_NAMED = re.compile(r"field `([^`]+)`")


@dataclass(frozen=True, slots=True)
class Violation:
    """Why event ``index`` of a request was refused (``code``: the request's error code
    when every violation has the same one, else ``validation_failed``)."""

    index: int
    field: str | None
    reason: str
    code: str = "validation_failed"

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "field": self.field, "reason": self.reason}


class InvalidEvents(IcefloeError):
    """A request failed validation; ``violations`` lists every bad event (capped)."""

    def __init__(self, code: str, message: str, violations: Sequence[Violation] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.violations = list(violations)


class Canonical(NamedTuple):
    """Canonical payloads of a request's events, in order, and ids taken from the body.

    A NamedTuple: one is built per request, at a third of a frozen dataclass's cost."""

    payloads: list[bytes]
    body_ids: list[str | None] | None
    format: int = 0
    """0: canonical JSON payloads; else a typed stream's binary ones (#39)."""
    schema_ids: list[int] | None = None
    """Binary payloads: each one's writer schema id (0: the stream's schema file)."""


class CompiledStream:
    """A stream's validator: built once at start, used for every request."""

    MAX_VIOLATIONS = 100

    def __init__(self, config: StreamConfig, registry_version: int = 0, *,
                 clock: Clock = SYSTEM, writers: WriterSchemas | None = None,
                 subject_problem: str | None = None) -> None:
        """``subject_problem``: why a subject stream's subject gives it no type (each
        request is refused naming it)."""
        self.config = config
        self._clock = clock
        self.name = config.name
        self.registry_version = registry_version
        """The stream-registry version this validator was built from (0: the config's
        streams); events it accepts are batched and routed under that version."""
        plain = [c for c in config.columns if c.mapping is None]
        fields: list[Any] = []
        self._cdc = Flattener(config) if config.cdc is not None else None
        """A change stream's rewrite of events into rows (:mod:`ingestor.changes`)."""
        keys = set(config.primary_key) if self._cdc is not None else set()
        for column in plain:
            kind = _plain_type(config, column)
            if column.required and column.name not in keys:  # a change without a key:
                # dead-lettered by the collector (missing_key), never a refused request
                fields.append((column.name, kind))
            else:
                fields.append((column.name, kind if column.type == "json" else kind | None,
                               None))
        self._mappings: EventMappings | None = None
        self._root_attrs: list[str] = []
        if any(c.path is not None or c.source == "body" or c.template is not None
               for c in config.columns):
            # One field per JSON-path root (unless a plain json column already is that field).
            self._mappings = EventMappings(config, {c.name for c in plain if c.type == "json"},
                                           _leaf_type, convert_value)
            fields += self._mappings.fields
            self._root_attrs = self._mappings.root_attrs
        self.meta_headers = [c for c in config.columns if c.header is not None]
        self.wants_meta = bool(self.meta_headers) or any(
            c.source in ("ip", "headers") or c.template is not None for c in config.columns)
        struct_name = "Event_" + re.sub(r"\W", "_", config.name)
        self._struct = msgspec.defstruct(
            struct_name, fields, omit_defaults=True, gc=False, kw_only=True,
            forbid_unknown_fields=config.unknown_fields == "reject")
        self._one = msgspec.json.Decoder(self._struct)
        # (a struct class made at run time: no static type to check)
        self._many = msgspec.json.Decoder(list[self._struct])  # type: ignore[name-defined]
        self._raw_list = msgspec.json.Decoder(list[msgspec.Raw])
        self._encoder = msgspec.json.Encoder()
        self._timestamps = [c.name for c in plain if c.type == "timestamp"]
        self._jsons = [c.name for c in plain if c.type == "json"]
        self._stamp_received = any(c.name == RECEIVED_AT and c.type == "timestamp"
                                   for c in plain)
        self._natives = _native_normalizers(plain)
        self._id_field = config.event_id_field
        self._id_column: Column | None = next(
            (c for c in config.columns if c.name == config.event_id_field), None)
        self._id_mapped = self._id_column is not None and self._id_column.path is not None
        self._evolve = config.unknown_fields == "evolve"
        self._known = frozenset(c.name for c in plain) | frozenset(
            str(parse_path(c.path)[0]) for c in config.columns if c.path is not None)
        """Top-level fields the stream reads: an evolving stream keeps every other one."""
        self._members = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
        self.typed = TypedDoor(config, writers, subject_problem) \
            if config.format != "json" else None
        """A Protobuf or Avro stream's payload checks (None: a JSON stream)."""

    @property
    def keeps_unknown(self) -> bool:
        """Whether this stream keeps undeclared fields (``unknown_fields = "evolve"``)."""
        return self._evolve

    # -- entry points ----------------------------------------------------------------------

    def from_binary(self, payloads: Sequence[bytes]) -> Canonical:
        """A typed stream's messages as sent (a gRPC ``Event.data`` each, an HTTP
        ``application/x-protobuf`` body); refused whole when one does not parse."""
        typed = self._typed_door("binary messages")
        if not payloads:
            raise InvalidEvents("empty_body", "the request holds no events")
        try:
            bodies, ids = typed.messages(payloads)
        except BadPayloads as exc:
            raise _bad_payloads(exc) from None
        return Canonical(bodies, event_ids(typed, bodies, ids), typed.code, ids)

    def from_delimited(self, body: bytes) -> Canonical:
        """Length-delimited Protobuf messages (varint length, then the message, repeated)."""
        self._typed_door("length-delimited messages")
        try:
            messages = split_delimited(body)
        except TypedPayloadError as exc:
            raise InvalidEvents("invalid_payload", f"the length-delimited body is malformed: "
                                f"{exc}") from None
        return self.from_binary(messages)

    def _typed_door(self, what: str) -> TypedDoor:
        if self.typed is None:
            raise UnsupportedMediaType(
                f"stream {self.name!r} takes JSON events; {what} go to a stream declared "
                'with format = "protobuf" or "avro"')
        return self.typed

    def _typed_json(self, objects: Sequence[bytes]) -> Canonical:
        """A Protobuf stream's events in Protobuf's canonical JSON, made binary."""
        assert self.typed is not None
        try:
            return self.from_binary(self.typed.from_json(objects))
        except BadPayloads as exc:
            raise _bad_payloads(exc) from None

    def _typed_objects(self, body: bytes) -> list[bytes]:
        start = body.lstrip()[:1]
        if start == b"{":
            return [body.strip()]
        if start == b"[":
            try:
                return [bytes(raw) for raw in self._raw_list.decode(body)]
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise InvalidEvents("invalid_json", f"the body must be a JSON object or an "
                                    f"array of objects: {exc}") from None
            except RecursionError:
                raise _too_deep() from None
        raise InvalidEvents("invalid_json", "the body must be a JSON object or an array of "
                            f"objects, it starts with {start!r}")

    def from_json(self, body: bytes) -> Canonical:
        """A body holding one JSON object or a JSON array of objects."""
        if self.typed is not None:
            return self._typed_json(self._typed_objects(body))
        if self._cdc is not None:
            return self._changes(self._typed_objects(body))
        try:
            if not body.isascii():
                _check_utf8(body)
            canonical = self._from_json(body)
            if self._evolve:
                start = body.lstrip()[:1]
                canonical = self._keep_unknown(canonical, body if start == b"[" else
                                               b"[" + body + b"]")
            return canonical
        except RecursionError:
            raise _too_deep() from None

    def _from_json(self, body: bytes) -> Canonical:
        start = body.lstrip()[:1]
        if self._mappings is not None and self._mappings.needs_raw and start in (b"[", b"{"):
            return self._from_raw_events(body, start)
        if start == b"[":
            try:
                events = self._many.decode(body)
            except msgspec.ValidationError:
                raise self._explain_array(body) from None
            except msgspec.DecodeError as exc:
                raise _malformed(exc) from None
            if not events:  # nothing to buffer: refused like an empty body, never a 500
                raise InvalidEvents("empty_body", "the JSON array holds no events: send at "
                                    "least one object")
        elif start == b"{":
            try:
                events = [self._one.decode(body)]
            except msgspec.ValidationError as exc:
                raise _invalid([self._named(_violation(0, exc))]) from None
            except msgspec.DecodeError as exc:
                raise _malformed(exc) from None
        elif not start:
            raise InvalidEvents("empty_body", "the request body is empty: send a JSON object, "
                                "a JSON array of objects, or NDJSON")
        else:
            raise InvalidEvents("invalid_json", "the body must be a JSON object or an array "
                                f"of objects, it starts with {start!r}")
        return self._canonical(events)

    def from_ndjson(self, body: bytes) -> Canonical:
        """Newline-delimited JSON objects (blank lines are skipped)."""
        if not body.isascii():
            _check_utf8(body)
        lines = [line for line in body.split(b"\n") if line.strip()]
        if not lines:
            raise InvalidEvents("empty_body", "the NDJSON body holds no events")
        if self.typed is not None:
            return self._typed_json(lines)
        if self._cdc is not None:
            return self._changes(lines)
        try:
            canonical = self._from_events(lines)
            return self._keep_unknown(canonical, b"[" + b",".join(lines) + b"]") \
                if self._evolve else canonical
        except RecursionError:
            raise _too_deep() from None

    def from_events(self, events: Sequence[bytes]) -> Canonical:
        """One JSON object per element (NDJSON lines, gRPC ``Event.json``)."""
        if not events:
            raise InvalidEvents("empty_body", "the request holds no events")
        if self.typed is not None:
            return self._typed_json(events)
        if self._cdc is not None:
            return self._changes(events)
        try:
            canonical = self._from_events(events, utf8_checked=False)
            return self._keep_unknown(canonical, b"[" + b",".join(events) + b"]") \
                if self._evolve else canonical
        except RecursionError:
            raise _too_deep() from None

    def from_entries(self, entries: Sequence[object]) -> Canonical:
        """Opaque byte entries of a ``payload = "bytes"`` stream, each kept whole in the
        stream's binary column (:mod:`icefloe.streams.entries`); any other entry is
        refused (``invalid_entry``)."""
        if self.config.payload != "bytes":
            raise InvalidEvents("not_a_bytes_stream", f"stream {self.name!r} takes JSON "
                                "events; opaque byte entries go to a stream declared with "
                                'payload = "bytes"')
        if not entries:
            raise InvalidEvents("empty_body", "the request holds no entries")
        checked: list[bytes | bytearray | memoryview] = []
        for index, entry in enumerate(entries):
            if not isinstance(entry, bytes | bytearray | memoryview):
                raise InvalidEvents("invalid_entry", f"entry {index} is a "
                                    f"{type(entry).__name__}; a bytes stream takes bytes",
                                    [Violation(index, None, "not bytes", "invalid_entry")])
            checked.append(entry)
        return Canonical([entry_payload(self.config, entry) for entry in checked], None)

    def split_invalid(self, events: Sequence[bytes]
                      ) -> tuple[list[int], Canonical, list[tuple[int, Violation]]]:
        """For ``on_invalid = "dead_letter"``: each event alone, as :meth:`from_events`
        would take it. Returns the indexes of the valid ones, their canonical form (in
        order) and ``(index, why)`` for every invalid one (no cap: each becomes a dead
        letter). Only called after the request as a whole failed, so it may be slow."""
        kept: list[int] = []
        payloads: list[bytes] = []
        ids: list[str | None] = []
        bad: list[tuple[int, Violation]] = []
        for index, event in enumerate(events):
            try:
                one = self.from_events([event])
            except InvalidEvents as exc:
                why = exc.violations[0] if exc.violations else Violation(0, None, str(exc),
                                                                         exc.code)
                bad.append((index, Violation(index, why.field, why.reason, exc.code)))
                continue
            kept.append(index)
            payloads.extend(one.payloads)
            ids.append(one.body_ids[0] if one.body_ids else None)
        return kept, Canonical(payloads, ids if any(ids) else None), bad

    def _changes(self, events: Sequence[bytes]) -> Canonical:
        """A change stream's events: flattened into rows (:mod:`ingestor.changes`), then
        validated as rows; each id derives from the change's position and key."""
        assert self._cdc is not None
        if not events:
            raise InvalidEvents("empty_body", "the request holds no events")
        flat, refused = flatten_events(self._cdc, events, self.MAX_VIOLATIONS)
        if refused:
            raise _invalid([Violation(*r) for r in refused])
        try:
            canonical = self._from_events(flat.rows, utf8_checked=False)
            if self._evolve:
                canonical = self._keep_unknown(canonical, b"[" + b",".join(flat.rows) + b"]")
        except RecursionError:
            raise _too_deep() from None
        return canonical._replace(body_ids=flat.ids)

    def _from_events(self, events: Sequence[bytes], utf8_checked: bool = True) -> Canonical:
        """Each element decoded on its own, never as one joined array: joined, the events
        ``{"a":1},{"b":"`` and ``"}`` read as two valid objects that no one sent (a string
        or a list spanning the comma), so a malformed pair would pass as plausible data."""
        if not utf8_checked and not all(map(bytes.isascii, events)):
            for index, event in enumerate(events):
                _check_utf8(event, index)
        try:
            decoded = list(map(self._one.decode, events))
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise self._explain_each(events) from None
        return self._canonical(decoded, events)

    def _from_raw_events(self, body: bytes, start: bytes) -> Canonical:
        """A body whose events' own JSON text is needed (a ``from = "body"`` column)."""
        if start == b"{":
            return self._from_events([body.strip()])
        try:
            raws = self._raw_list.decode(body)
        except msgspec.ValidationError as exc:
            raise InvalidEvents("invalid_json", "the body must be an array of objects: "
                                f"{exc}") from None
        except msgspec.DecodeError as exc:
            raise _malformed(exc) from None
        if not raws:
            raise InvalidEvents("empty_body", "the JSON array holds no events: send at "
                                "least one object")
        return self._from_events([bytes(raw) for raw in raws])

    def request_meta(self, client: str | None, header: Callable[[str], str | None],
                     all_headers: Callable[[], Iterable[tuple[str, str]]] | None = None
                     ) -> bytes:
        """The envelope meta a request's records carry (b"" when no mapping needs one).

        Raises:
            InvalidEvents: a required header is missing (``missing_header``).
        """
        if not self.wants_meta:
            return b""
        try:
            meta = request_meta(self.config, client, header, all_headers)
        except MappingViolation as exc:
            raise InvalidEvents("missing_header", f"column {exc.field}: {exc.reason}",
                                [Violation(0, exc.field, exc.reason)]) from None
        return self._encoder.encode(meta) if meta else b""

    def _keep_unknown(self, canonical: Canonical, array: bytes) -> Canonical:
        """An evolving stream's payloads with the fields it does not declare kept in
        :data:`~icefloe.streams.evolution.EXTRA_FIELD`, as the JSON text of one object.

        Why a string member and not the fields themselves: the collector's columnar decode
        reads it as one ``json`` column, and only the collector, which sees the table, may
        turn fields into columns (see :mod:`icefloe.streams.evolution`). ``array`` is the
        request's events as one JSON array; it already decoded once, so it decodes here.
        """
        encode = self._encoder.encode
        payloads = canonical.payloads
        for index, members in enumerate(self._members.decode(array)):
            extra = {k: v for k, v in members.items() if k not in self._known}
            if not extra:
                continue
            text = msgspec.json.format(encode(extra), indent=-1)  # minified, as stored
            member = b'"' + EXTRA_FIELD.encode() + b'":' + encode(text.decode())
            payload = payloads[index]
            payloads[index] = payload[:-1] + b"," + member + b"}" if len(payload) > 2 \
                else b"{" + member + b"}"
        return canonical

    # -- canonical form --------------------------------------------------------------------

    def _canonical(self, events: list[Any], raws: Sequence[bytes] | None = None) -> Canonical:
        if self._stamp_received:
            self._received_now(events)
        if self._mappings is not None:
            return self._canonical_mapped(events, raws)
        if self._timestamps or self._jsons or self._natives:
            self._normalize_many(events)
        elif not events:  # every entry point refuses this first; never frame zero events
            raise InvalidEvents("empty_body", "the request holds no events")
        encode = self._encoder.encode
        payloads = [encode(events[0])] if len(events) == 1 else \
            [encode(event) for event in events]
        ids = None
        if self._id_field is not None:
            name = self._id_field
            ids = [_id_text(getattr(event, name)) for event in events]
        return Canonical(payloads, ids)

    def _canonical_mapped(self, events: list[Any], raws: Sequence[bytes] | None) -> Canonical:
        """The canonical payloads of a stream with ``path``/``body`` columns: the plain
        fields as usual, then each mapped value spliced in as one more top-level field."""
        mappings = self._mappings
        assert mappings is not None
        violations: list[Violation] = []
        extras: list[bytes] = []
        mapped_ids: list[str | None] = []
        normalize = self._normalize if self._timestamps or self._jsons or self._natives \
            else None
        extract = mappings.extract
        for index, event in enumerate(events):
            try:
                extras.append(extract(event, raws[index] if raws else None))
                mapped_ids.append(mappings.event_id)
                if normalize is not None:
                    normalize(event)
            except (MappingViolation, OutOfRange) as exc:
                violations.append(Violation(index, exc.field, exc.reason,
                                            getattr(exc, "code", "validation_failed")))
                extras.append(b"")
                if len(violations) >= self.MAX_VIOLATIONS:
                    break
        if violations:
            raise _invalid(violations)
        ids = None
        if self._id_field is not None and not self._id_mapped:
            name = self._id_field
            ids = [_id_text(getattr(event, name)) for event in events]
        encode = self._encoder.encode
        payloads: list[bytes] = []
        roots = self._root_attrs
        for event, extra in zip(events, extras, strict=True):
            for attr in roots:
                setattr(event, attr, None)
            payload = encode(event)
            if extra:  # append the members: '{...}' + ',"col":v...' → '{...,"col":v...}'
                payload = payload[:-1] + extra + b"}" if len(payload) > 2 else \
                    b"{" + extra[1:] + b"}"
            payloads.append(payload)
        if self._id_mapped:
            ids = [_id_text(value) for value in mapped_ids]
        return Canonical(payloads, ids)

    def _received_now(self, events: list[Any]) -> None:
        """Fill a missing or null ``received_at`` with the time this request is validated
        (one clock read per request; the envelope's ``_received_at`` is stamped moments
        later, when the events are buffered)."""
        now: dt.datetime | None = None
        for event in events:
            if getattr(event, RECEIVED_AT) is None:
                if now is None:
                    now = dt.datetime.fromtimestamp(self._clock.time(), dt.UTC)
                setattr(event, RECEIVED_AT, now)

    def _named(self, violation: Violation) -> Violation:
        """A type error inside a mapped JSON path, reported under its column's name."""
        if self._mappings is None or violation.field not in self._mappings.violations:
            return violation
        column, path = self._mappings.violations[violation.field]
        reason = violation.reason.replace(" | null", "")
        return Violation(violation.index, column, f"value at {path}: {reason}")

    def _normalize(self, event: Any) -> None:
        """Timestamps to UTC datetimes, ``json`` values to text, in place.

        Raises:
            OutOfRange: a timestamp that cannot be represented.
        """
        for name in self._timestamps:
            value = getattr(event, name)
            if value.__class__ is not dt.datetime or value.tzinfo is not dt.UTC:
                setattr(event, name, _utc(name, value))
        self._normalize_jsons(event)
        if self._natives:
            _normalize_natives(self._natives, event)

    def _normalize_many(self, events: list[Any]) -> None:
        """:meth:`_normalize` for a whole request, with the common case checked in bulk.

        Why: a timestamp that decoded as a UTC datetime (``...Z``) needs nothing, and
        finding those is one pass per column (compiled where built: ~1 µs per 100 events,
        else ~7 µs of comprehensions); only the others (epoch ms, other offsets, null) are
        visited one by one, against ~25 µs for visiting every event.

        Raises:
            InvalidEvents: every event with a timestamp out of range, by index.
        """
        bad: dict[int, Violation] = {}
        for name in self._timestamps:
            for index in _not_utc(events, name):
                try:
                    setattr(events[index], name, _utc(name, getattr(events[index], name)))
                except OutOfRange as exc:
                    bad.setdefault(index, Violation(index, exc.field, exc.reason, exc.code))
        if self._jsons:
            self._normalize_all_jsons(events, bad)
        if self._natives:
            _normalize_all_natives(self._natives, events, bad)
        if bad:
            raise _invalid([bad[index] for index in sorted(bad)])

    def _normalize_all_jsons(self, events: list[Any], bad: dict[int, Violation]) -> None:
        """:meth:`_normalize_jsons` of every event; each refused one lands in ``bad``."""
        start = 0
        while start < len(events):
            index = start
            try:
                for index in range(start, len(events)):
                    self._normalize_jsons(events[index])
                return
            except OutOfRange as exc:  # rare: note it and go on after it
                bad.setdefault(index, Violation(index, exc.field, exc.reason, exc.code))
                start = index + 1

    def _normalize_jsons(self, event: Any) -> None:
        """``json`` values to text, checked as a reader will need them (:func:`json_text`).

        Raises:
            OutOfRange: too deep, or a number beyond the double range.
        """
        for name in self._jsons:
            value = getattr(event, name)
            if value is not None:
                text = bytes(value)
                if text == b"null":
                    setattr(event, name, None)
                elif len(text) > _SHORT_JSON or _LOWER_E in text or _UPPER_E in text:
                    setattr(event, name, json_text(name, text))
                else:  # too short to nest too deep or hold a 309-digit number, no exponent
                    setattr(event, name, text.decode())

    # -- slow paths: say exactly what is wrong ------------------------------------------------

    def _explain_array(self, body: bytes) -> InvalidEvents:
        try:
            raws = self._raw_list.decode(body)
        except msgspec.ValidationError as exc:
            return InvalidEvents("invalid_json", f"the body must be an array of objects: {exc}")
        except msgspec.DecodeError as exc:
            return _malformed(exc)
        return self._explain_each([bytes(raw) for raw in raws])

    def _explain_each(self, events: Sequence[bytes]) -> InvalidEvents:
        violations: list[Violation] = []
        malformed = False
        for index, event in enumerate(events):
            if not event.strip():
                malformed = True
                violations.append(Violation(index, None, "empty: an event must be a JSON "
                                            "object"))
                continue
            try:
                decoded = self._one.decode(event)
                if self._mappings is not None:  # so one report names every bad event
                    self._mappings.extract(decoded, event)
                self._normalize(decoded)
            except msgspec.ValidationError as exc:
                violations.append(self._named(_violation(index, exc)))
            except msgspec.DecodeError as exc:
                malformed = True
                violations.append(Violation(index, None, f"malformed JSON: {exc}"))
            except (OutOfRange, MappingViolation) as exc:  # decoded, but invalid
                violations.append(Violation(index, exc.field, exc.reason,
                                            getattr(exc, "code", "validation_failed")))
            if len(violations) >= self.MAX_VIOLATIONS:
                break
        if not violations:  # every event decodes alone: a joint problem (should not happen)
            violations.append(Violation(0, None, "the events could not be decoded together"))
        if malformed:
            return InvalidEvents("invalid_json", f"{len(violations)} event(s) are not valid "
                                 "JSON objects", violations)
        return _invalid(violations)


def _not_utc_py(events: list[Any], name: str) -> list[int]:
    """Indexes of the events whose ``name`` is not a datetime in UTC (the reference for
    the compiled ``_speedups.not_utc``)."""
    values = [getattr(event, name) for event in events]
    return [index for index, value in enumerate(values)
            if value.__class__ is not dt.datetime or value.tzinfo is not dt.UTC]


def _not_utc(events: list[Any], name: str) -> list[int]:
    if _speedups is not None and type(events) is list:
        found: list[int] = _speedups.not_utc(events, name, dt.UTC)
        return found
    return _not_utc_py(events, name)


def _utc(name: str, value: dt.datetime | int | None) -> dt.datetime | None:
    """A decoded timestamp (aware datetime or epoch milliseconds) as a UTC datetime."""
    if value is None:
        return None
    try:
        if value.__class__ is int:
            assert isinstance(value, int)
            if not -MAX_EPOCH_MS <= value <= MAX_EPOCH_MS:
                raise OutOfRange(name, f"epoch milliseconds {value} out of range")
            return EPOCH + dt.timedelta(milliseconds=value)
        assert isinstance(value, dt.datetime)
        return value.astimezone(dt.UTC) if value.utcoffset() else value
    except OverflowError:  # past year 9999 or before year 1 once in UTC
        raise OutOfRange(name, f"{value} is outside the years 1-9999 in UTC") from None


def _bad_payloads(exc: BadPayloads) -> InvalidEvents:
    return InvalidEvents("invalid_payload", str(exc), [
        Violation(index, error.field, str(error), "invalid_payload")
        for index, error in exc.bad])


def _check_utf8(body: bytes, index: int | None = None) -> None:
    """Refuse text that is not UTF-8 (JSON must be; msgspec checks only the strings it
    keeps, so a bad byte in a dropped field or a ``json`` value would pass it)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"event {index}: " if index is not None else ""
        violations = [] if index is None else [Violation(index, None, "not UTF-8",
                                                         "invalid_utf8")]
        raise InvalidEvents("invalid_utf8", f"{where}the body is not valid UTF-8 (byte "
                            f"{exc.start}: {exc.reason}); JSON must be UTF-8",
                            violations) from None


def _too_deep() -> InvalidEvents:
    return InvalidEvents("json_too_deep", "the JSON nests deeper than the decoder allows; "
                         f"values icefloe stores may nest at most {MAX_JSON_DEPTH} levels")


def _plain_type(config: StreamConfig, column: Column) -> Any:
    """The msgspec type of a plain column: a flat type's, or a native one's built from its
    type string (:mod:`icefloe.streams.native`)."""
    kind = FIELD_TYPES.get(column.type)
    if kind is not None:
        return kind
    return field_type(column.type, f"{config.name}_{column.name}",
                      config.unknown_fields == "reject")


def _native_normalizers(plain: list[Column]) -> list[tuple[str, Normalizer]]:
    """``(column, normalizer)`` of every plain native column that needs a visit."""
    found: list[tuple[str, Normalizer]] = []
    for column in plain:
        if column.type in FIELD_TYPES:
            continue
        visit = normalizer(column.type)
        if visit is not None:
            found.append((column.name, visit))
    return found


def _normalize_natives(natives: list[tuple[str, Normalizer]], event: Any) -> None:
    """Native values to their canonical form, in place. Raises OutOfRange with the path."""
    for name, visit in natives:
        value = getattr(event, name)
        if value is not None:
            setattr(event, name, visit(value, name))


def _normalize_all_natives(natives: list[tuple[str, Normalizer]], events: list[Any],
                           bad: dict[int, Violation]) -> None:
    """:func:`_normalize_natives` of every event; each refused one lands in ``bad``."""
    for index, event in enumerate(events):
        if index in bad:
            continue
        try:
            _normalize_natives(natives, event)
        except OutOfRange as exc:
            bad[index] = Violation(index, exc.field, exc.reason, exc.code)


def _leaf_type(column: Column) -> Any:
    """The msgspec type a mapped JSON path's value is decoded as."""
    if column.type == "json" or (column.type == "string" and column.raw):
        return msgspec.Raw
    return FIELD_TYPES[column.type]


def _id_text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _violation(index: int, exc: msgspec.ValidationError) -> Violation:
    match = _AT.match(str(exc))
    reason = match.group("reason") if match else str(exc)
    field = match.group("path") if match and match.group("path") else None
    if field is None:
        named = _NAMED.search(reason)
        field = named.group(1) if named else None
    reason = reason[:1].lower() + reason[1:]
    return Violation(index, field, reason)


def _invalid(violations: list[Violation]) -> InvalidEvents:
    codes = {v.code for v in violations}
    return InvalidEvents(codes.pop() if len(codes) == 1 else "validation_failed",
                         f"{len(violations)} event(s) failed validation; nothing was accepted",
                         violations)


def _malformed(exc: msgspec.DecodeError) -> InvalidEvents:
    if "trailing characters" in str(exc):  # {...},{...}: records joined, not an array
        return InvalidEvents("invalid_json", f"malformed JSON: {exc}; several events go in "
                             "one JSON array or NDJSON (Kafka Connect's HTTP sink: set "
                             "batch.json.as.array=true)")
    return InvalidEvents("invalid_json", f"malformed JSON: {exc}")


_EXTRA_MEMBER = b'"' + EXTRA_FIELD.encode() + b'":"'


def with_client(payloads: list[bytes], token_name: str) -> list[bytes]:
    """Evolving payloads that kept undeclared fields, with the write token's config name
    in :data:`~icefloe.streams.evolution.CLIENT_FIELD` (the others unchanged).

    Why: the collector charges the columns such an event adds to the client that sent it
    (evolution quotas); only it sees the table. The member rides in the payload, not the
    envelope, so the envelope format does not change, older collectors ignore it (their
    decode ignores unknown members) and older batches read as "no token". The extra member
    is always a JSON string (``"_icefloe_extra":"``) added last; a field value can never
    hold those bytes unescaped, so finding them finds the member."""
    member = b',"' + CLIENT_FIELD.encode() + b'":' + msgspec.json.encode(token_name) + b"}"
    return [p[:-1] + member if _EXTRA_MEMBER in p else p for p in payloads]
