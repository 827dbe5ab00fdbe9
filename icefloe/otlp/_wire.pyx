# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""OTLP export requests straight from protobuf wire bytes to canonical rows (compiled).

Why: the Python path (parse with the ``opentelemetry-proto`` classes, then
:func:`icefloe.otlp.rows.export_rows` with ``canonical=True``) costs ~9 µs per log record in
attribute reads and msgspec structs, which kept OTLP/HTTP below plain JSON events (issue 41).
This module reads the wire format once and writes the same JSON bytes directly.

The Python path stays the reference and the fallback: whatever this module is not sure to
read exactly as the protobuf runtime (upb) would — malformed or truncated wire data, a string
that is not UTF-8, a singular message sent twice (protobuf merges those), a time or count
past 2^63 or a metric without data (the Python path rejects those records), group wire
types, very deep values, ``entity_refs`` — raises :class:`Reference`, and the caller runs
the reference path on the same bytes, which answers with its own result or refusal. So
this module never refuses anything itself and never accepts what the reference would
refuse. tests/core/test_otlp_wire.py holds both paths to the same bytes over generated,
re-encoded and broken requests.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.math cimport isfinite, isnan
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy, memset

import msgspec

ctypedef const unsigned char* Wire

cdef object _ENCODE = msgspec.json.Encoder().encode
cdef uint64_t _LONG_MAX = 0x7FFFFFFFFFFFFFFF
cdef int _MAX_DEPTH = 24
"""Nested arrays/kvlists deeper than this go to the reference (upb's own limit is 100 for
the whole message)."""
cdef Py_ssize_t _MAX_ENTRIES = 4096
"""A key/value list longer than this goes to the reference (the repeat check is quadratic)."""
cdef const char* _HEX = b"0123456789abcdef"
cdef const char* _B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
cdef tuple _SPAN_KINDS = (b"UNSPECIFIED", b"INTERNAL", b"SERVER", b"CLIENT", b"PRODUCER",
                          b"CONSUMER")
cdef tuple _STATUS_CODES = (b"UNSET", b"OK", b"ERROR")


class Reference(Exception):
    """This request must be read by the reference path (the message says why)."""


cdef int _refer(str why) except -1:
    raise Reference(why)

include "_wire_json.pxi"
include "_wire_values.pxi"


# -- resources and scopes -------------------------------------------------------------------

cdef bytes _SERVICE = b"service.name"


cdef int _resource_part(Buf* b, Wire p, bint has, Py_ssize_t rs, Py_ssize_t re,
                        Py_ssize_t us, Py_ssize_t ue) except -1:
    """The resource columns (``,"service_name":...,"resource_schema_url":...``) of one
    ``Resource{Logs,Spans}``: ``rs..re`` the ``Resource``, ``us..ue`` the schema URL."""
    cdef Entries attrs
    cdef uint64_t dropped = 0
    cdef Py_ssize_t pos = rs, i, ks, ke
    cdef uint32_t field
    cdef int wt
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        while has and pos < re:
            _tag(p, re, &pos, &field, &wt)
            if field == 1:
                _len(p, re, &pos, wt, &ks, &ke)
                _add(&attrs, p, ks, ke)
            elif field == 2:
                dropped = _scalar(p, re, &pos, wt, 0)
            elif field == 3:
                _refer("a Resource has entity_refs")
            else:
                _skip(p, re, &pos, wt)
        for i in range(attrs.n):
            if (attrs.items[i].ke - attrs.items[i].ks == 12
                    and memcmp(p + attrs.items[i].ks, PyBytes_AS_STRING(_SERVICE), 12) == 0
                    and not _null(&attrs.items[i].value)):
                _lit(b, b',"service_name":')
                _put_text(b, p, &attrs.items[i].value)
        _lit(b, b',"resource_attributes":')
        _put_attributes(b, p, &attrs)
        _put_key_uint(b, b',"resource_dropped_attributes_count":', <uint32_t>dropped)
        _put_key_str(b, b',"resource_schema_url":', p, us, ue)
    finally:
        _free_entries(&attrs)
    return 0


cdef int _scope_part(Buf* b, Wire p, bint has, Py_ssize_t ss, Py_ssize_t se,
                     Py_ssize_t us, Py_ssize_t ue) except -1:
    """The scope columns and the closing brace, after the resource's (see :func:`_shared`
    in :mod:`icefloe.otlp.rows`)."""
    cdef Entries attrs
    cdef uint64_t dropped = 0
    cdef Py_ssize_t pos = ss, ns = 0, ne = 0, vs = 0, ve = 0, ks, ke
    cdef uint32_t field
    cdef int wt
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        while has and pos < se:
            _tag(p, se, &pos, &field, &wt)
            if field == 1:
                _string(p, se, &pos, wt, &ns, &ne)
            elif field == 2:
                _string(p, se, &pos, wt, &vs, &ve)
            elif field == 3:
                _len(p, se, &pos, wt, &ks, &ke)
                _add(&attrs, p, ks, ke)
            elif field == 4:
                dropped = _scalar(p, se, &pos, wt, 0)
            else:
                _skip(p, se, &pos, wt)
        _put_key_str(b, b',"scope_name":', p, ns, ne)
        _put_key_str(b, b',"scope_version":', p, vs, ve)
        _lit(b, b',"scope_attributes":')
        _put_attributes(b, p, &attrs)
        _put_key_uint(b, b',"scope_dropped_attributes_count":', <uint32_t>dropped)
        _put_key_str(b, b',"scope_schema_url":', p, us, ue)
        _put(b, b"}", 1)
    finally:
        _free_entries(&attrs)
    return 0


ctypedef int (*RowFn)(Buf*, Wire, Py_ssize_t, Py_ssize_t) except -1


cdef int _heads(Wire p, Py_ssize_t s, Py_ssize_t e, bint* has, Py_ssize_t* hs,
                Py_ssize_t* he, Py_ssize_t* us, Py_ssize_t* ue) except -1:
    """A ``Resource*``'s or ``Scope*``'s head (field 1: its resource or scope, sent at most
    once) and schema URL (field 3, the last one), wherever they are among its items
    (field 2, checked for their bounds only)."""
    cdef Py_ssize_t pos = s, is_, ie
    cdef uint32_t field
    cdef int wt
    has[0] = False
    us[0] = ue[0] = s
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field == 1:
            if has[0]:
                _refer("a resource or scope is sent twice (protobuf merges them)")
            has[0] = True
            _len(p, e, &pos, wt, hs, he)
        elif field == 2:
            _len(p, e, &pos, wt, &is_, &ie)
        elif field == 3:
            _string(p, e, &pos, wt, us, ue)
        else:
            _skip(p, e, &pos, wt)
    return 0


cdef int _scope_rows(list rows, Wire p, Py_ssize_t s, Py_ssize_t e, RowFn row, Buf* res,
                     Buf* tail, Buf* out) except -1:
    """The rows of one ``Scope{Logs,Spans}``: each item's row, then the shared tail."""
    cdef bint has
    cdef Py_ssize_t hs = 0, he = 0, us, ue, pos = s, is_, ie
    cdef uint32_t field
    cdef int wt
    cdef bytes found
    _heads(p, s, e, &has, &hs, &he, &us, &ue)
    tail.size = 0
    _put(tail, res.data, res.size)
    _scope_part(tail, p, has, hs, he, us, ue)
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field != 2:
            _skip(p, e, &pos, wt)
            continue
        _len(p, e, &pos, wt, &is_, &ie)
        out.size = 0
        row(out, p, is_, ie)
        out.data[0] = b'{'  # every member was written with a leading comma
        found = PyBytes_FromStringAndSize(NULL, out.size + tail.size)
        memcpy(PyBytes_AS_STRING(found), out.data, out.size)
        memcpy(PyBytes_AS_STRING(found) + out.size, tail.data, tail.size)
        rows.append(found)
    return 0


cdef list _rows(bytes body, RowFn row):
    """Every row of an export request (its ``Resource*`` are field 1)."""
    cdef Wire p = <Wire>PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body), pos = 0, s, e, rpos, hs = 0, he = 0, us, ue
    cdef Py_ssize_t ss, se
    cdef uint32_t field
    cdef int wt
    cdef bint has
    cdef list rows = []
    cdef Buf res, tail, out
    res.data = tail.data = out.data = NULL
    res.size = res.cap = tail.size = tail.cap = out.size = out.cap = 0
    try:
        while pos < n:
            _tag(p, n, &pos, &field, &wt)
            if field != 1:
                _skip(p, n, &pos, wt)
                continue
            _len(p, n, &pos, wt, &s, &e)
            _heads(p, s, e, &has, &hs, &he, &us, &ue)
            res.size = 0
            _resource_part(&res, p, has, hs, he, us, ue)
            rpos = s
            while rpos < e:
                _tag(p, e, &rpos, &field, &wt)
                if field != 2:
                    _skip(p, e, &rpos, wt)
                    continue
                _len(p, e, &rpos, wt, &ss, &se)
                _scope_rows(rows, p, ss, se, row, &res, &tail, &out)
    finally:
        free(res.data)
        free(tail.data)
        free(out.data)
    return rows


# -- log records ----------------------------------------------------------------------------

cdef struct LogFields:
    uint64_t ns, observed, severity, dropped, flags
    Py_ssize_t sts, ste, tis, tie, sis, sie, evs, eve
    AV body


cdef int _read_log(LogFields* f, Entries* attrs, Wire p, Py_ssize_t s, Py_ssize_t e
                   ) except -1:
    cdef Py_ssize_t pos = s, vs, ve
    cdef uint32_t field
    cdef int wt
    cdef bint has_body = False
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field == 1:
            f.ns = _scalar(p, e, &pos, wt, 1)
        elif field == 11:
            f.observed = _scalar(p, e, &pos, wt, 1)
        elif field == 2:
            f.severity = _scalar(p, e, &pos, wt, 0)
        elif field == 3:
            _string(p, e, &pos, wt, &f.sts, &f.ste)
        elif field == 5:
            if has_body:
                _refer("a log record sends its body twice (protobuf merges them)")
            has_body = True
            _len(p, e, &pos, wt, &vs, &ve)
            _anyvalue(p, vs, ve, &f.body)
        elif field == 6:
            _len(p, e, &pos, wt, &vs, &ve)
            _add(attrs, p, vs, ve)
        elif field == 7:
            f.dropped = _scalar(p, e, &pos, wt, 0)
        elif field == 8:
            f.flags = _scalar(p, e, &pos, wt, 5)
        elif field == 9:
            _len(p, e, &pos, wt, &f.tis, &f.tie)
        elif field == 10:
            _len(p, e, &pos, wt, &f.sis, &f.sie)
        elif field == 12:
            _string(p, e, &pos, wt, &f.evs, &f.eve)
        else:
            _skip(p, e, &pos, wt)
    return 0


cdef int _log_row(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """A ``LogRecord``'s members, each after a comma (:class:`icefloe.otlp.row_types.LogRow`:
    a record without a time takes its observed time)."""
    cdef LogFields f
    cdef Entries attrs
    memset(&f, 0, sizeof(LogFields))
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        _read_log(&f, &attrs, p, s, e)
        if f.ns > _LONG_MAX or f.observed > _LONG_MAX:
            _refer("a log record's time is past 2^63 ns (the reference rejects it)")
        _put_key_time(b, b',"time":', f.ns if f.ns else f.observed)
        _put_key_uint(b, b',"time_unix_nano":', f.ns)
        _put_key_time(b, b',"observed_time":', f.observed)
        _put_key_uint(b, b',"observed_time_unix_nano":', f.observed)
        _lit(b, b',"severity_number":')
        _put_int(b, <int32_t><uint32_t>f.severity)
        _put_key_str(b, b',"severity_text":', p, f.sts, f.ste)
        if not _null(&f.body):
            _lit(b, b',"body":')
            _put_text(b, p, &f.body)
        _lit(b, b',"attributes":')
        _put_attributes(b, p, &attrs)
        _put_key_uint(b, b',"dropped_attributes_count":', <uint32_t>f.dropped)
        _put_key_uint(b, b',"flags":', <uint32_t>f.flags)
        _put_key_hex(b, b',"trace_id":', p, f.tis, f.tie)
        _put_key_hex(b, b',"span_id":', p, f.sis, f.sie)
        _put_key_str(b, b',"event_name":', p, f.evs, f.eve)
    finally:
        _free_entries(&attrs)
    return 0


def log_rows(bytes body):
    """The canonical rows (``export_rows("logs", ..., canonical=True)``) of an
    ``ExportLogsServiceRequest``'s wire bytes. Raises :class:`Reference` when only the
    reference path can tell (see the module's doc)."""
    return _rows(body, _log_row)


# -- spans ----------------------------------------------------------------------------------

cdef int _span_event(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """One ``Span.Event`` as :class:`icefloe.otlp.row_types.SpanEvent`."""
    cdef uint64_t ns = 0, dropped = 0
    cdef Py_ssize_t pos = s, nms = 0, nme = 0, vs, ve, at = b.size
    cdef uint32_t field
    cdef int wt
    cdef Entries attrs
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        while pos < e:
            _tag(p, e, &pos, &field, &wt)
            if field == 1:
                ns = _scalar(p, e, &pos, wt, 1)
            elif field == 2:
                _string(p, e, &pos, wt, &nms, &nme)
            elif field == 3:
                _len(p, e, &pos, wt, &vs, &ve)
                _add(&attrs, p, vs, ve)
            elif field == 4:
                dropped = _scalar(p, e, &pos, wt, 0)
            else:
                _skip(p, e, &pos, wt)
        if ns > _LONG_MAX:
            _refer("a span event's time is past 2^63 ns (the reference rejects the span)")
        _put_key_time(b, b',"time":', ns)
        _put_key_uint(b, b',"time_unix_nano":', ns)
        _put_key_str(b, b',"name":', p, nms, nme)
        _lit(b, b',"attributes":')
        _put_attributes(b, p, &attrs)
        _put_key_uint(b, b',"dropped_attributes_count":', <uint32_t>dropped)
        b.data[at] = b'{'
        _put(b, b"}", 1)
    finally:
        _free_entries(&attrs)
    return 0


cdef int _span_link(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """One ``Span.Link`` as :class:`icefloe.otlp.row_types.SpanLink`."""
    cdef uint64_t flags = 0, dropped = 0
    cdef Py_ssize_t pos = s, tis = 0, tie = 0, sis = 0, sie = 0, tss = 0, tse = 0, vs, ve
    cdef Py_ssize_t at = b.size
    cdef uint32_t field
    cdef int wt
    cdef Entries attrs
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        while pos < e:
            _tag(p, e, &pos, &field, &wt)
            if field == 1:
                _len(p, e, &pos, wt, &tis, &tie)
            elif field == 2:
                _len(p, e, &pos, wt, &sis, &sie)
            elif field == 3:
                _string(p, e, &pos, wt, &tss, &tse)
            elif field == 4:
                _len(p, e, &pos, wt, &vs, &ve)
                _add(&attrs, p, vs, ve)
            elif field == 5:
                dropped = _scalar(p, e, &pos, wt, 0)
            elif field == 6:
                flags = _scalar(p, e, &pos, wt, 5)
            else:
                _skip(p, e, &pos, wt)
        _put_key_hex(b, b',"trace_id":', p, tis, tie)
        _put_key_hex(b, b',"span_id":', p, sis, sie)
        _put_key_str(b, b',"trace_state":', p, tss, tse)
        _lit(b, b',"attributes":')
        _put_attributes(b, p, &attrs)
        _put_key_uint(b, b',"flags":', <uint32_t>flags)
        _put_key_uint(b, b',"dropped_attributes_count":', <uint32_t>dropped)
        b.data[at] = b'{'
        _put(b, b"}", 1)
    finally:
        _free_entries(&attrs)
    return 0


cdef int _put_items(Buf* b, bytes key, Wire p, Py_ssize_t s, Py_ssize_t e, uint32_t number,
                    RowFn item) except -1:
    """``,"key":[...]``: every field ``number`` of the message in ``s..e`` by ``item``."""
    cdef Py_ssize_t pos = s, is_, ie
    cdef uint32_t field
    cdef int wt
    cdef bint first = True
    _lit(b, key)
    _put(b, b"[", 1)
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field != number:
            _skip(p, e, &pos, wt)
            continue
        _len(p, e, &pos, wt, &is_, &ie)
        if not first:
            _put(b, b",", 1)
        first = False
        item(b, p, is_, ie)
    return _put(b, b"]", 1)


cdef int _status(Wire p, Py_ssize_t s, Py_ssize_t e, uint64_t* code, Py_ssize_t* ms,
                 Py_ssize_t* me) except -1:
    cdef Py_ssize_t pos = s
    cdef uint32_t field
    cdef int wt
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field == 2:
            _string(p, e, &pos, wt, ms, me)
        elif field == 3:
            code[0] = _scalar(p, e, &pos, wt, 0)
        else:
            _skip(p, e, &pos, wt)
    return 0


cdef struct SpanFields:
    uint64_t flags, kind, start, end, dropped, dropped_events, dropped_links, code
    Py_ssize_t tis, tie, sis, sie, pis, pie, tss, tse, nms, nme, ms, me


cdef int _read_span(SpanFields* f, Entries* attrs, Wire p, Py_ssize_t s, Py_ssize_t e
                    ) except -1:
    """A ``Span``'s scalars, strings and attributes (its events and links are read when
    written, :func:`_put_items`)."""
    cdef Py_ssize_t pos = s, vs, ve
    cdef uint32_t field
    cdef int wt
    cdef bint has_status = False
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field == 1:
            _len(p, e, &pos, wt, &f.tis, &f.tie)
        elif field == 2:
            _len(p, e, &pos, wt, &f.sis, &f.sie)
        elif field == 3:
            _string(p, e, &pos, wt, &f.tss, &f.tse)
        elif field == 4:
            _len(p, e, &pos, wt, &f.pis, &f.pie)
        elif field == 16:
            f.flags = _scalar(p, e, &pos, wt, 5)
        elif field == 5:
            _string(p, e, &pos, wt, &f.nms, &f.nme)
        elif field == 6:
            f.kind = _scalar(p, e, &pos, wt, 0)
        elif field == 7:
            f.start = _scalar(p, e, &pos, wt, 1)
        elif field == 8:
            f.end = _scalar(p, e, &pos, wt, 1)
        elif field == 9:
            _len(p, e, &pos, wt, &vs, &ve)
            _add(attrs, p, vs, ve)
        elif field == 10:
            f.dropped = _scalar(p, e, &pos, wt, 0)
        elif field == 11 or field == 13:  # events, links: read when written
            _len(p, e, &pos, wt, &vs, &ve)
        elif field == 12:
            f.dropped_events = _scalar(p, e, &pos, wt, 0)
        elif field == 14:
            f.dropped_links = _scalar(p, e, &pos, wt, 0)
        elif field == 15:
            if has_status:
                _refer("a span sends its status twice (protobuf merges them)")
            has_status = True
            _len(p, e, &pos, wt, &vs, &ve)
            _status(p, vs, ve, &f.code, &f.ms, &f.me)
        else:
            _skip(p, e, &pos, wt)
    return 0


cdef int _span_row(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """A ``Span``'s members, each after a comma (:class:`icefloe.otlp.row_types.SpanRow`)."""
    cdef SpanFields f
    cdef Entries attrs
    memset(&f, 0, sizeof(SpanFields))
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        _read_span(&f, &attrs, p, s, e)
        if f.start > _LONG_MAX or f.end > _LONG_MAX:
            _refer("a span's time is past 2^63 ns (the reference rejects it)")
        _put_key_hex(b, b',"trace_id":', p, f.tis, f.tie)
        _put_key_hex(b, b',"span_id":', p, f.sis, f.sie)
        _put_key_hex(b, b',"parent_span_id":', p, f.pis, f.pie)
        _put_key_str(b, b',"trace_state":', p, f.tss, f.tse)
        _put_key_str(b, b',"name":', p, f.nms, f.nme)
        _lit(b, b',"kind":')
        _put_enum(b, _SPAN_KINDS, f.kind)
        _put_key_time(b, b',"start_time":', f.start)
        _put_key_uint(b, b',"start_time_unix_nano":', f.start)
        _put_key_time(b, b',"end_time":', f.end)
        _put_key_uint(b, b',"end_time_unix_nano":', f.end)
        if f.start and f.end:
            _lit(b, b',"duration_ns":')
            _put_int(b, <int64_t>f.end - <int64_t>f.start)
        _lit(b, b',"status_code":')
        _put_enum(b, _STATUS_CODES, f.code)
        _put_key_str(b, b',"status_message":', p, f.ms, f.me)
        _lit(b, b',"attributes":')
        _put_attributes(b, p, &attrs)
        _put_key_uint(b, b',"dropped_attributes_count":', <uint32_t>f.dropped)
        _put_items(b, b',"events":', p, s, e, 11, _span_event)
        _put_key_uint(b, b',"dropped_events_count":', <uint32_t>f.dropped_events)
        _put_items(b, b',"links":', p, s, e, 13, _span_link)
        _put_key_uint(b, b',"dropped_links_count":', <uint32_t>f.dropped_links)
        _put_key_uint(b, b',"flags":', <uint32_t>f.flags)
    finally:
        _free_entries(&attrs)
    return 0


def span_rows(bytes body):
    """The canonical rows (``export_rows("traces", ..., canonical=True)``) of an
    ``ExportTraceServiceRequest``'s wire bytes. Raises :class:`Reference` when only the
    reference path can tell (see the module's doc)."""
    return _rows(body, _span_row)


include "_wire_metrics.pxi"
