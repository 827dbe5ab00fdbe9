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


# -- output buffer --------------------------------------------------------------------------

cdef struct Buf:
    char* data
    Py_ssize_t size
    Py_ssize_t cap


cdef int _grow(Buf* b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap = b.cap * 2 if b.cap else 512
    cdef char* data
    while cap < b.size + extra:
        cap *= 2
    data = <char*>realloc(b.data, cap)
    if data == NULL:
        raise MemoryError()
    b.data = data
    b.cap = cap
    return 0


cdef inline int _put(Buf* b, const char* s, Py_ssize_t n) except -1:
    if b.size + n > b.cap:
        _grow(b, n)
    memcpy(b.data + b.size, s, n)
    b.size += n
    return 0


cdef inline int _lit(Buf* b, bytes s) except -1:
    return _put(b, PyBytes_AS_STRING(s), PyBytes_GET_SIZE(s))


cdef int _put_str(Buf* b, const char* s, Py_ssize_t n) except -1:
    """``s`` (UTF-8, already checked) as a JSON string, escaped as msgspec escapes."""
    cdef Py_ssize_t i
    cdef unsigned char c
    cdef char* o
    if b.size + 6 * n + 2 > b.cap:
        _grow(b, 6 * n + 2)
    o = b.data + b.size
    o[0] = b'"'
    o += 1
    for i in range(n):
        c = <unsigned char>s[i]
        if c >= 0x20 and c != 0x22 and c != 0x5C:
            o[0] = <char>c
            o += 1
        else:
            o[0] = b'\\'
            if c == 0x22 or c == 0x5C:
                o[1] = <char>c
            elif c == 0x08:
                o[1] = b'b'
            elif c == 0x09:
                o[1] = b't'
            elif c == 0x0A:
                o[1] = b'n'
            elif c == 0x0C:
                o[1] = b'f'
            elif c == 0x0D:
                o[1] = b'r'
            else:
                o[1] = b'u'
                o[2] = b'0'
                o[3] = b'0'
                o[4] = _HEX[c >> 4]
                o[5] = _HEX[c & 15]
                o += 4
            o += 2
    o[0] = b'"'
    o += 1
    b.size = o - b.data
    return 0


cdef int _put_uint(Buf* b, uint64_t v) except -1:
    cdef char digits[24]
    cdef int n = 24
    while True:
        n -= 1
        digits[n] = <char>(48 + v % 10)
        v //= 10
        if v == 0:
            break
    return _put(b, digits + n, 24 - n)


cdef int _put_int(Buf* b, int64_t v) except -1:
    if v < 0:
        _put(b, b"-", 1)
        return _put_uint(b, <uint64_t>0 - <uint64_t>v)
    return _put_uint(b, <uint64_t>v)


cdef int _put_double(Buf* b, double d) except -1:
    """A finite double as msgspec writes it (its own shortest form, not ``repr``'s)."""
    cdef bytes text = _ENCODE(d)
    return _put(b, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))


cdef int _put_non_finite(Buf* b, double d) except -1:
    if isnan(d):
        return _put(b, b'"NaN"', 5)
    if d > 0:
        return _put(b, b'"Infinity"', 10)
    return _put(b, b'"-Infinity"', 11)


cdef int _put_hex(Buf* b, Wire s, Py_ssize_t n) except -1:
    cdef Py_ssize_t i
    cdef char* o
    if b.size + 2 * n + 2 > b.cap:
        _grow(b, 2 * n + 2)
    o = b.data + b.size
    o[0] = b'"'
    for i in range(n):
        o[1 + 2 * i] = _HEX[s[i] >> 4]
        o[2 + 2 * i] = _HEX[s[i] & 15]
    o[1 + 2 * n] = b'"'
    b.size += 2 * n + 2
    return 0


cdef int _put_b64(Buf* b, Wire s, Py_ssize_t n) except -1:
    """``"<standard base64 with padding>"``."""
    cdef Py_ssize_t i = 0
    cdef uint32_t v
    cdef char* o
    if b.size + (n + 2) // 3 * 4 + 2 > b.cap:
        _grow(b, (n + 2) // 3 * 4 + 2)
    o = b.data + b.size
    o[0] = b'"'
    o += 1
    while i + 3 <= n:
        v = (<uint32_t>s[i] << 16) | (<uint32_t>s[i + 1] << 8) | s[i + 2]
        o[0] = _B64[v >> 18]
        o[1] = _B64[(v >> 12) & 63]
        o[2] = _B64[(v >> 6) & 63]
        o[3] = _B64[v & 63]
        o += 4
        i += 3
    if n - i == 1:
        v = <uint32_t>s[i] << 16
        o[0] = _B64[v >> 18]
        o[1] = _B64[(v >> 12) & 63]
        o[2] = b'='
        o[3] = b'='
        o += 4
    elif n - i == 2:
        v = (<uint32_t>s[i] << 16) | (<uint32_t>s[i + 1] << 8)
        o[0] = _B64[v >> 18]
        o[1] = _B64[(v >> 12) & 63]
        o[2] = _B64[(v >> 6) & 63]
        o[3] = b'='
        o += 4
    o[0] = b'"'
    o += 1
    b.size = o - b.data
    return 0


cdef inline void _two(char* o, int v):
    o[0] = <char>(48 + v // 10)
    o[1] = <char>(48 + v % 10)


cdef int _put_time(Buf* b, uint64_t ns) except -1:
    """``"YYYY-MM-DDTHH:MM:SS[.ffffff]Z"`` of 0 < ns <= 2^63-1, as :func:`time_of` writes it
    (microseconds, truncated; no fraction on a whole microsecond-less second)."""
    cdef uint64_t seconds = ns // 1000000000
    cdef uint64_t micros = (ns % 1000000000) // 1000
    cdef int64_t days = <int64_t>(seconds // 86400), z, era, doe, yoe, y, doy, mp, d, m
    cdef int sod = <int>(seconds % 86400)
    cdef char o[32]
    cdef int i
    z = days + 719468  # civil_from_days (H. Hinnant), days since 1970-01-01 >= 0
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    if m <= 2:
        y += 1
    o[0] = b'"'
    _two(o + 1, <int>(y // 100))
    _two(o + 3, <int>(y % 100))
    o[5] = b'-'
    _two(o + 6, <int>m)
    o[8] = b'-'
    _two(o + 9, <int>d)
    o[11] = b'T'
    _two(o + 12, sod // 3600)
    o[14] = b':'
    _two(o + 15, (sod // 60) % 60)
    o[17] = b':'
    _two(o + 18, sod % 60)
    if micros:
        o[20] = b'.'
        for i in range(6):
            o[26 - i] = <char>(48 + micros % 10)
            micros //= 10
        o[27] = b'Z'
        o[28] = b'"'
        return _put(b, o, 29)
    o[20] = b'Z'
    o[21] = b'"'
    return _put(b, o, 22)


# -- wire reading ---------------------------------------------------------------------------

cdef inline int _varint(Wire p, Py_ssize_t end, Py_ssize_t* pos, uint64_t* out) except -1:
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef unsigned char c
    cdef Py_ssize_t i = pos[0]
    while True:
        if i >= end:
            _refer("a varint runs past its message")
        c = p[i]
        i += 1
        if shift == 63 and c > 1:
            _refer("a varint is longer than 64 bits")
        v |= (<uint64_t>(c & 0x7F)) << shift
        if c < 0x80:
            break
        shift += 7
    pos[0] = i
    out[0] = v
    return 0


cdef inline uint64_t _fixed(Wire p, Py_ssize_t end, Py_ssize_t* pos, int size) except? 0:
    cdef uint64_t v = 0
    cdef int k
    if pos[0] + size > end:
        _refer("a fixed-size field runs past its message")
    for k in range(size):
        v |= (<uint64_t>p[pos[0] + k]) << (8 * k)
    pos[0] += size
    return v


cdef inline int _tag(Wire p, Py_ssize_t end, Py_ssize_t* pos, uint32_t* field, int* wt
                     ) except -1:
    cdef uint64_t tag
    cdef Py_ssize_t start = pos[0]
    _varint(p, end, pos, &tag)
    if tag > 0xFFFFFFFF or tag >> 3 == 0 or pos[0] - start > 5:
        _refer("a tag is over 5 bytes, or its field number is 0 or out of range")
    field[0] = <uint32_t>(tag >> 3)
    wt[0] = <int>(tag & 7)
    return 0


cdef inline int _len(Wire p, Py_ssize_t end, Py_ssize_t* pos, int wt, Py_ssize_t* s,
                     Py_ssize_t* e) except -1:
    """A length-delimited field's bounds (``wt`` must be 2)."""
    cdef uint64_t n
    cdef Py_ssize_t start = pos[0]
    if wt != 2:
        _refer("a known field has an unexpected wire type")
    _varint(p, end, pos, &n)
    if pos[0] - start > 5:
        _refer("a length is over 5 bytes")
    if n > <uint64_t>(end - pos[0]):
        _refer("a length-delimited field runs past its message")
    s[0] = pos[0]
    e[0] = pos[0] + <Py_ssize_t>n
    pos[0] = e[0]
    return 0


cdef inline uint64_t _scalar(Wire p, Py_ssize_t end, Py_ssize_t* pos, int wt, int want
                             ) except? 0:
    """A varint (``want`` 0), fixed64 (1) or fixed32 (5) field's value."""
    cdef uint64_t v
    if wt != want:
        _refer("a known field has an unexpected wire type")
    if wt == 0:
        _varint(p, end, pos, &v)
        return v
    return _fixed(p, end, pos, 8 if wt == 1 else 4)


cdef int _skip(Wire p, Py_ssize_t end, Py_ssize_t* pos, int wt) except -1:
    """Step over an unknown field (groups and invalid wire types: the reference decides)."""
    cdef uint64_t v
    cdef Py_ssize_t s, e
    if wt == 0:
        _varint(p, end, pos, &v)
    elif wt == 1:
        _fixed(p, end, pos, 8)
    elif wt == 5:
        _fixed(p, end, pos, 4)
    elif wt == 2:
        _len(p, end, pos, 2, &s, &e)
    else:
        _refer("a group or an invalid wire type")
    return 0


cdef int _utf8(Wire s, Py_ssize_t n) except -1:
    """Refer strings that are not strict UTF-8 (overlong forms, surrogates, past U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef unsigned char c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c >= 0xC2 and c <= 0xDF:
            if i + 1 < n and (s[i + 1] & 0xC0) == 0x80:
                i += 2
                continue
        elif c >= 0xE0 and c <= 0xEF:
            if i + 2 < n and (s[i + 1] & 0xC0) == 0x80 and (s[i + 2] & 0xC0) == 0x80:
                c1 = s[i + 1]
                if not ((c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 >= 0xA0)):
                    i += 3
                    continue
        elif c >= 0xF0 and c <= 0xF4:
            if (i + 3 < n and (s[i + 1] & 0xC0) == 0x80 and (s[i + 2] & 0xC0) == 0x80
                    and (s[i + 3] & 0xC0) == 0x80):
                c1 = s[i + 1]
                if not ((c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 >= 0x90)):
                    i += 4
                    continue
        _refer("a string is not UTF-8")
    return 0


cdef inline int _string(Wire p, Py_ssize_t end, Py_ssize_t* pos, int wt, Py_ssize_t* s,
                        Py_ssize_t* e) except -1:
    """A ``string`` field's bounds, checked to be UTF-8 as upb checks proto3 strings."""
    _len(p, end, pos, wt, s, e)
    return _utf8(p + s[0], e[0] - s[0])


# -- AnyValue and key/value lists -----------------------------------------------------------

cdef struct AV:
    int case  # the oneof field number set last (0: none; 8, string_value_strindex: null)
    Py_ssize_t s
    Py_ssize_t e
    uint64_t num


cdef int _anyvalue(Wire p, Py_ssize_t s, Py_ssize_t e, AV* av) except -1:
    """An ``AnyValue``'s set member (its nested array or kvlist is read when written)."""
    cdef Py_ssize_t pos = s
    cdef uint32_t field
    cdef int wt
    av.case = 0
    av.num = 0
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field > 8:
            _skip(p, e, &pos, wt)
            continue
        if av.case == 5 or av.case == 6:
            if field == av.case:
                _refer("an AnyValue sends its array or kvlist twice (protobuf merges them)")
            _check(p, av)  # replaced, yet read by the reference: it must be valid
        if field == 1:
            _string(p, e, &pos, wt, &av.s, &av.e)
        elif field == 5 or field == 6 or field == 7:
            _len(p, e, &pos, wt, &av.s, &av.e)
        elif field == 4:
            av.num = _scalar(p, e, &pos, wt, 1)
        else:  # 2 bool, 3 int64, 8 strindex
            av.num = _scalar(p, e, &pos, wt, 0)
        av.case = field
    return 0


cdef struct Entry:
    Py_ssize_t ks
    Py_ssize_t ke
    AV value


cdef struct Entries:
    Entry* items
    Py_ssize_t n
    Py_ssize_t cap


cdef int _keyvalue(Wire p, Py_ssize_t s, Py_ssize_t e, Entry* out) except -1:
    cdef Py_ssize_t pos = s, vs, ve
    cdef uint32_t field
    cdef int wt
    cdef bint has_value = False
    out.ks = out.ke = s
    out.value.case = 0
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field == 1:
            _string(p, e, &pos, wt, &out.ks, &out.ke)
        elif field == 2:
            if has_value:
                _refer("a KeyValue sends its value twice (protobuf merges them)")
            has_value = True
            _len(p, e, &pos, wt, &vs, &ve)
            _anyvalue(p, vs, ve, &out.value)
        elif field == 3:
            _scalar(p, e, &pos, wt, 0)
        else:
            _skip(p, e, &pos, wt)
    return 0


cdef int _add(Entries* list_, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """One ``KeyValue`` onto ``list_``: a repeated key keeps its first place and takes the
    later value (as the dict of the Python path does)."""
    cdef Entry entry
    cdef Entry* items
    cdef Py_ssize_t i, klen
    _keyvalue(p, s, e, &entry)
    klen = entry.ke - entry.ks
    for i in range(list_.n):
        if (list_.items[i].ke - list_.items[i].ks == klen
                and memcmp(p + list_.items[i].ks, p + entry.ks, klen) == 0):
            _check(p, &list_.items[i].value)  # replaced, yet read by the reference
            list_.items[i].value = entry.value
            return 0
    if list_.n >= _MAX_ENTRIES:
        _refer("a key/value list is very long")
    if list_.n == list_.cap:
        list_.cap = list_.cap * 2 if list_.cap else 16
        items = <Entry*>realloc(list_.items, list_.cap * sizeof(Entry))
        if items == NULL:
            raise MemoryError()
        list_.items = items
    list_.items[list_.n] = entry
    list_.n += 1
    return 0


cdef int _check(Wire p, AV* av) except -1:
    """Read a nested array or kvlist that no row shows (a later value replaces it), as the
    reference reads it: what it would refuse in there, this module must refer."""
    cdef Buf scratch
    if av.case != 5 and av.case != 6:
        return 0
    scratch.data = NULL
    scratch.size = scratch.cap = 0
    try:
        _put_plain(&scratch, p, av, 0)
    finally:
        free(scratch.data)
    return 0


cdef inline bint _null(AV* av):
    return av.case == 0 or av.case == 8


cdef int _put_text(Buf* b, Wire p, AV* av) except -1:
    """A non-null ``AnyValue`` as :func:`icefloe.otlp.values.text_of` makes it, quoted."""
    cdef Buf inner
    cdef double d
    if av.case == 1:
        return _put_str(b, <const char*>p + av.s, av.e - av.s)
    if av.case == 2:
        return _lit(b, b'"true"' if av.num else b'"false"')
    if av.case == 3:
        _put(b, b'"', 1)
        _put_int(b, <int64_t>av.num)
        return _put(b, b'"', 1)
    if av.case == 4:
        memcpy(&d, &av.num, 8)
        if not isfinite(d):
            return _put_non_finite(b, d)
        _put(b, b'"', 1)
        _put_double(b, d)
        return _put(b, b'"', 1)
    if av.case == 7:
        return _put_b64(b, p + av.s, av.e - av.s)
    inner.data = NULL
    inner.size = inner.cap = 0
    try:
        _put_plain(&inner, p, av, 0)
        _put_str(b, inner.data, inner.size)
    finally:
        free(inner.data)
    return 0


cdef int _put_plain(Buf* b, Wire p, AV* av, int depth) except -1:
    """An ``AnyValue`` as JSON, as msgspec encodes :func:`icefloe.otlp.values.plain`'s."""
    cdef double d
    cdef Py_ssize_t pos, s, e, i
    cdef uint32_t field
    cdef int wt
    cdef bint first = True
    cdef AV item
    cdef Entries entries
    if av.case == 0 or av.case == 8:
        return _put(b, b"null", 4)
    if av.case == 1:
        return _put_str(b, <const char*>p + av.s, av.e - av.s)
    if av.case == 2:
        return _lit(b, b"true" if av.num else b"false")
    if av.case == 3:
        return _put_int(b, <int64_t>av.num)
    if av.case == 4:
        memcpy(&d, &av.num, 8)
        return _put_double(b, d) if isfinite(d) else _put_non_finite(b, d)
    if av.case == 7:
        return _put_b64(b, p + av.s, av.e - av.s)
    if depth >= _MAX_DEPTH:
        _refer("an AnyValue is nested very deep")
    pos = av.s
    if av.case == 5:
        _put(b, b"[", 1)
        while pos < av.e:
            _tag(p, av.e, &pos, &field, &wt)
            if field != 1:
                _skip(p, av.e, &pos, wt)
                continue
            _len(p, av.e, &pos, wt, &s, &e)
            _anyvalue(p, s, e, &item)
            if not first:
                _put(b, b",", 1)
            first = False
            _put_plain(b, p, &item, depth + 1)
        return _put(b, b"]", 1)
    entries.items = NULL
    entries.n = entries.cap = 0
    try:
        _entries(&entries, p, av.s, av.e, 1)
        _put(b, b"{", 1)
        for i in range(entries.n):
            if i:
                _put(b, b",", 1)
            _put_str(b, <const char*>p + entries.items[i].ks,
                     entries.items[i].ke - entries.items[i].ks)
            _put(b, b":", 1)
            _put_plain(b, p, &entries.items[i].value, depth + 1)
        _put(b, b"}", 1)
    finally:
        free(entries.items)
    return 0


cdef int _entries(Entries* out, Wire p, Py_ssize_t s, Py_ssize_t e, uint32_t number
                  ) except -1:
    """Every ``KeyValue`` of field ``number`` of the message in ``s..e``, onto ``out``."""
    cdef Py_ssize_t pos = s, ks, ke
    cdef uint32_t field
    cdef int wt
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field != number:
            _skip(p, e, &pos, wt)
            continue
        _len(p, e, &pos, wt, &ks, &ke)
        _add(out, p, ks, ke)
    return 0


cdef int _put_attributes(Buf* b, Wire p, Entries* list_) except -1:
    """``[{"key":k,"value":text or null},...]``: the canonical ``map<string,string>``."""
    cdef Py_ssize_t i
    _put(b, b"[", 1)
    for i in range(list_.n):
        _put(b, b'{"key":' if i == 0 else b',{"key":', 7 if i == 0 else 8)
        _put_str(b, <const char*>p + list_.items[i].ks, list_.items[i].ke - list_.items[i].ks)
        _put(b, b',"value":', 9)
        if _null(&list_.items[i].value):
            _put(b, b"null}", 5)
        else:
            _put_text(b, p, &list_.items[i].value)
            _put(b, b"}", 1)
    return _put(b, b"]", 1)


cdef int _put_key_str(Buf* b, bytes key, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """``,"key":"value"`` unless the string is empty (proto3's unset: a null column)."""
    if e > s:
        _lit(b, key)
        _put_str(b, <const char*>p + s, e - s)
    return 0


cdef int _put_key_hex(Buf* b, bytes key, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """``,"key":"<hex>"`` unless the id is empty (unset)."""
    if e > s:
        _lit(b, key)
        _put_hex(b, p + s, e - s)
    return 0


cdef int _put_key_uint(Buf* b, bytes key, uint64_t v) except -1:
    _lit(b, key)
    return _put_uint(b, v)


cdef inline void _free_entries(Entries* list_):
    free(list_.items)
    list_.items = NULL
    list_.n = list_.cap = 0


cdef int _put_key_time(Buf* b, bytes key, uint64_t ns) except -1:
    """``,"<name>":"<time>"`` unless ``ns`` is 0 (unset); the caller checked the range."""
    if ns:
        _lit(b, key)
        _put_time(b, ns)
    return 0


cdef int _put_enum(Buf* b, tuple names, uint64_t raw) except -1:
    """An enum's name without its prefix, or its decimal text (values the proto does not
    name: :func:`icefloe.otlp.values.enum_name`)."""
    cdef int32_t value = <int32_t><uint32_t>raw
    if 0 <= value < len(names):
        _put(b, b'"', 1)
        _lit(b, <bytes>names[value])
        return _put(b, b'"', 1)
    _put(b, b'"', 1)
    _put_int(b, value)
    return _put(b, b'"', 1)


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


# -- metrics: gauge, sum, histogram, exponential histogram and summary points ---------------

cdef tuple _TEMPORALITIES = (b"UNSPECIFIED", b"DELTA", b"CUMULATIVE")
cdef dict _METRIC_KINDS = {5: "gauge", 7: "sum", 9: "histogram", 10: "exponential_histogram",
                           11: "summary"}
"""A ``Metric``'s data member (field number) -> the kind of its rows."""


cdef int _put_number(Buf* b, int which, uint64_t raw) except -1:
    """``,"value":...,"value_int":...`` of a point or exemplar's ``value`` oneof
    (:func:`icefloe.otlp.metric_rows._number`): a double (null unless finite), or an int's
    double and its exact value; nothing when unset."""
    cdef double d
    if which == 4:
        memcpy(&d, &raw, 8)
        if isfinite(d):
            _lit(b, b',"value":')
            _put_double(b, d)
    elif which == 6:
        _lit(b, b',"value":')
        _put_double(b, <double><int64_t>raw)
        _lit(b, b',"value_int":')
        _put_int(b, <int64_t>raw)
    return 0


cdef int _exemplar(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """One ``Exemplar`` as :class:`icefloe.otlp.row_types.Exemplar`."""
    cdef uint64_t ns = 0, raw = 0
    cdef int which = 0
    cdef Py_ssize_t pos = s, tis = 0, tie = 0, sis = 0, sie = 0, vs, ve, at = b.size
    cdef uint32_t field
    cdef int wt
    cdef Entries attrs
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        while pos < e:
            _tag(p, e, &pos, &field, &wt)
            if field == 7:
                _len(p, e, &pos, wt, &vs, &ve)
                _add(&attrs, p, vs, ve)
            elif field == 2:
                ns = _scalar(p, e, &pos, wt, 1)
            elif field == 3 or field == 6:
                raw = _scalar(p, e, &pos, wt, 1)
                which = 4 if field == 3 else 6
            elif field == 4:
                _len(p, e, &pos, wt, &sis, &sie)
            elif field == 5:
                _len(p, e, &pos, wt, &tis, &tie)
            else:
                _skip(p, e, &pos, wt)
        if ns > _LONG_MAX:
            _refer("an exemplar's time is past 2^63 ns (the reference rejects the point)")
        _put_key_time(b, b',"time":', ns)
        _put_key_uint(b, b',"time_unix_nano":', ns)
        _put_number(b, which, raw)
        _put_key_hex(b, b',"trace_id":', p, tis, tie)
        _put_key_hex(b, b',"span_id":', p, sis, sie)
        _lit(b, b',"filtered_attributes":')
        _put_attributes(b, p, &attrs)
        b.data[at] = b'{'
        _put(b, b"}", 1)
    finally:
        _free_entries(&attrs)
    return 0


cdef struct Metric:
    int kind  # the data member's field number: 5 gauge, 7 sum (others are referred)
    Py_ssize_t ds, de  # the Gauge or Sum message
    uint64_t temporality, monotonic


cdef int _number_point(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e, Metric* m) except -1:
    """A ``NumberDataPoint``'s members after its metric's (:func:`_gauge` and :func:`_sum`
    of :mod:`icefloe.otlp.metric_rows`), each after a comma."""
    cdef uint64_t ns = 0, start = 0, flags = 0, raw = 0
    cdef int which = 0
    cdef Py_ssize_t pos = s, vs, ve
    cdef uint32_t field
    cdef int wt
    cdef Entries attrs
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        while pos < e:
            _tag(p, e, &pos, &field, &wt)
            if field == 7:
                _len(p, e, &pos, wt, &vs, &ve)
                _add(&attrs, p, vs, ve)
            elif field == 2:
                start = _scalar(p, e, &pos, wt, 1)
            elif field == 3:
                ns = _scalar(p, e, &pos, wt, 1)
            elif field == 4 or field == 6:
                raw = _scalar(p, e, &pos, wt, 1)
                which = field
            elif field == 5:
                _len(p, e, &pos, wt, &vs, &ve)
            elif field == 8:
                flags = _scalar(p, e, &pos, wt, 0)
            else:
                _skip(p, e, &pos, wt)
        if ns > _LONG_MAX or start > _LONG_MAX:
            _refer("a point's time is past 2^63 ns (the reference rejects it)")
        _put_key_time(b, b',"time":', ns)
        _put_key_uint(b, b',"time_unix_nano":', ns)
        _put_key_time(b, b',"start_time":', start)
        _put_key_uint(b, b',"start_time_unix_nano":', start)
        _lit(b, b',"attributes":')
        _put_attributes(b, p, &attrs)
        _put_key_uint(b, b',"flags":', <uint32_t>flags)
        _put_number(b, which, raw)
        _put_items(b, b',"exemplars":', p, s, e, 5, _exemplar)
        if m.kind == 7:
            _lit(b, b',"aggregation_temporality":')
            _put_enum(b, _TEMPORALITIES, m.temporality)
            _lit(b, b',"is_monotonic":true' if m.monotonic else b',"is_monotonic":false')
    finally:
        _free_entries(&attrs)
    return 0


cdef int _put_fixed_list(Buf* b, bytes key, Wire p, Py_ssize_t s, Py_ssize_t e,
                         uint32_t number, bint doubles) except -1:
    """``,"key":[...]``: a repeated ``fixed64`` (counts, each at most 2^63-1) or ``double``
    (null unless finite, as msgspec writes NaN) field, packed or not, in wire order."""
    cdef Py_ssize_t pos = s, vs, ve, k
    cdef uint32_t field
    cdef int wt
    cdef bint first = True
    cdef uint64_t raw
    cdef double d
    _lit(b, key)
    _put(b, b"[", 1)
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field != number:
            _skip(p, e, &pos, wt)
            continue
        if wt == 2:
            _len(p, e, &pos, wt, &vs, &ve)
            if (ve - vs) % 8:
                _refer("a packed 64-bit list is not a whole number of values")
        else:
            vs = pos
            _scalar(p, e, &pos, wt, 1)
            ve = pos
        k = vs
        while k < ve:
            raw = _fixed(p, ve, &k, 8)
            if not first:
                _put(b, b",", 1)
            first = False
            if doubles:
                memcpy(&d, &raw, 8)
                if isfinite(d):
                    _put_double(b, d)
                else:
                    _put(b, b"null", 4)
            elif raw > _LONG_MAX:
                _refer("a bucket count is past 2^63-1 (the reference rejects the point)")
            else:
                _put_uint(b, raw)
    return _put(b, b"]", 1)


cdef int _put_optional(Buf* b, bytes key, bint has, uint64_t raw) except -1:
    """``,"key":<double>`` of a proto3 ``optional double`` that is set and finite."""
    cdef double d
    memcpy(&d, &raw, 8)
    if has and isfinite(d):
        _lit(b, key)
        _put_double(b, d)
    return 0


cdef int _histogram_point(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e, Metric* m
                          ) except -1:
    """A ``HistogramDataPoint``'s members after its metric's
    (:func:`icefloe.otlp.metric_rows._histogram`), each after a comma."""
    cdef uint64_t ns = 0, start = 0, flags = 0, count = 0, total = 0, low = 0, high = 0
    cdef bint has_sum = False, has_min = False, has_max = False
    cdef Py_ssize_t pos = s, vs, ve
    cdef uint32_t field
    cdef int wt
    cdef Entries attrs
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        while pos < e:
            _tag(p, e, &pos, &field, &wt)
            if field == 9:
                _len(p, e, &pos, wt, &vs, &ve)
                _add(&attrs, p, vs, ve)
            elif field == 2:
                start = _scalar(p, e, &pos, wt, 1)
            elif field == 3:
                ns = _scalar(p, e, &pos, wt, 1)
            elif field == 4:
                count = _scalar(p, e, &pos, wt, 1)
            elif field == 5:
                total = _scalar(p, e, &pos, wt, 1)
                has_sum = True
            elif field == 11:
                low = _scalar(p, e, &pos, wt, 1)
                has_min = True
            elif field == 12:
                high = _scalar(p, e, &pos, wt, 1)
                has_max = True
            elif field == 10:
                flags = _scalar(p, e, &pos, wt, 0)
            else:  # 6 bucket_counts, 7 explicit_bounds, 8 exemplars: read when written
                _skip(p, e, &pos, wt)
        if ns > _LONG_MAX or start > _LONG_MAX or count > _LONG_MAX:
            _refer("a point's time or count is past 2^63 (the reference rejects it)")
        _put_key_time(b, b',"time":', ns)
        _put_key_uint(b, b',"time_unix_nano":', ns)
        _put_key_time(b, b',"start_time":', start)
        _put_key_uint(b, b',"start_time_unix_nano":', start)
        _lit(b, b',"attributes":')
        _put_attributes(b, p, &attrs)
        _put_key_uint(b, b',"flags":', <uint32_t>flags)
        _put_key_uint(b, b',"count":', count)
        _put_optional(b, b',"sum":', has_sum, total)
        _put_optional(b, b',"min":', has_min, low)
        _put_optional(b, b',"max":', has_max, high)
        _put_fixed_list(b, b',"bucket_counts":', p, s, e, 6, False)
        _put_fixed_list(b, b',"explicit_bounds":', p, s, e, 7, True)
        _lit(b, b',"aggregation_temporality":')
        _put_enum(b, _TEMPORALITIES, m.temporality)
        _put_items(b, b',"exemplars":', p, s, e, 8, _exemplar)
    finally:
        _free_entries(&attrs)
    return 0


cdef int _quantile(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """One ``ValueAtQuantile`` as :class:`icefloe.otlp.row_types.Quantile` (a non-finite
    member is left out)."""
    cdef uint64_t q = 0, v = 0
    cdef Py_ssize_t pos = s, at = b.size
    cdef uint32_t field
    cdef int wt
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field == 1:
            q = _scalar(p, e, &pos, wt, 1)
        elif field == 2:
            v = _scalar(p, e, &pos, wt, 1)
        else:
            _skip(p, e, &pos, wt)
    _put_optional(b, b',"quantile":', True, q)
    _put_optional(b, b',"value":', True, v)
    if b.size == at:
        return _put(b, b"{}", 2)
    b.data[at] = b'{'
    return _put(b, b"}", 1)


cdef int _summary_point(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e, Metric* m) except -1:
    """A ``SummaryDataPoint``'s members after its metric's
    (:func:`icefloe.otlp.metric_rows._summary`), each after a comma."""
    cdef uint64_t ns = 0, start = 0, flags = 0, count = 0, total = 0
    cdef Py_ssize_t pos = s, vs, ve
    cdef uint32_t field
    cdef int wt
    cdef Entries attrs
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        while pos < e:
            _tag(p, e, &pos, &field, &wt)
            if field == 7:
                _len(p, e, &pos, wt, &vs, &ve)
                _add(&attrs, p, vs, ve)
            elif field == 2:
                start = _scalar(p, e, &pos, wt, 1)
            elif field == 3:
                ns = _scalar(p, e, &pos, wt, 1)
            elif field == 4:
                count = _scalar(p, e, &pos, wt, 1)
            elif field == 5:
                total = _scalar(p, e, &pos, wt, 1)
            elif field == 6:
                _len(p, e, &pos, wt, &vs, &ve)
            elif field == 8:
                flags = _scalar(p, e, &pos, wt, 0)
            else:
                _skip(p, e, &pos, wt)
        if ns > _LONG_MAX or start > _LONG_MAX or count > _LONG_MAX:
            _refer("a point's time or count is past 2^63 (the reference rejects it)")
        _point_head(b, p, ns, start, &attrs, flags)
        _put_key_uint(b, b',"count":', count)
        _put_optional(b, b',"sum":', True, total)
        _put_items(b, b',"quantile_values":', p, s, e, 6, _quantile)
    finally:
        _free_entries(&attrs)
    return 0


cdef int _point_head(Buf* b, Wire p, uint64_t ns, uint64_t start, Entries* attrs,
                     uint64_t flags) except -1:
    """A point's times, attributes and flags (after its metric's columns)."""
    _put_key_time(b, b',"time":', ns)
    _put_key_uint(b, b',"time_unix_nano":', ns)
    _put_key_time(b, b',"start_time":', start)
    _put_key_uint(b, b',"start_time_unix_nano":', start)
    _lit(b, b',"attributes":')
    _put_attributes(b, p, attrs)
    return _put_key_uint(b, b',"flags":', <uint32_t>flags)


cdef inline int32_t _zigzag32(uint64_t raw):
    """A ``sint32`` from its varint (the low 32 bits, zig-zag decoded, as upb reads it)."""
    cdef uint32_t u = <uint32_t>raw
    return <int32_t>((u >> 1) ^ (<uint32_t>0 - (u & 1)))


cdef int _buckets(Buf* b, bytes offset_key, bytes counts_key, Wire p, bint has,
                  Py_ssize_t s, Py_ssize_t e) except -1:
    """An exponential histogram's ``Buckets``: its offset (``sint32``) and its counts
    (``uint64``, packed or not, each at most 2^63-1)."""
    cdef Py_ssize_t pos = s, vs, ve, k
    cdef uint32_t field, u = 0
    cdef int wt
    cdef uint64_t raw
    cdef Buf counts
    cdef bint first = True
    memset(&counts, 0, sizeof(Buf))
    try:
        _put(&counts, b"[", 1)
        while has and pos < e:
            _tag(p, e, &pos, &field, &wt)
            if field == 1:
                u = <uint32_t>_scalar(p, e, &pos, wt, 0)
            elif field == 2:
                if wt == 2:
                    _len(p, e, &pos, wt, &vs, &ve)
                else:
                    vs = pos
                    _scalar(p, e, &pos, wt, 0)
                    ve = pos
                k = vs
                while k < ve:
                    _varint(p, ve, &k, &raw)
                    if raw > _LONG_MAX:
                        _refer("a bucket count is past 2^63-1 (the reference rejects it)")
                    if not first:
                        _put(&counts, b",", 1)
                    first = False
                    _put_uint(&counts, raw)
            else:
                _skip(p, e, &pos, wt)
        _put(&counts, b"]", 1)
        _lit(b, offset_key)
        _put_int(b, _zigzag32(u))
        _lit(b, counts_key)
        _put(b, counts.data, counts.size)
    finally:
        free(counts.data)
    return 0


cdef struct ExpFields:
    uint64_t ns, start, flags, count, total, low, high, zero_count, zero_threshold, scale
    bint has_sum, has_min, has_max, has_pos, has_neg
    Py_ssize_t ps, pe, ns_, ne_


cdef int _read_exponential(ExpFields* f, Entries* attrs, Wire p, Py_ssize_t s, Py_ssize_t e
                           ) except -1:
    cdef Py_ssize_t pos = s, vs, ve
    cdef uint32_t field
    cdef int wt
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field == 1:
            _len(p, e, &pos, wt, &vs, &ve)
            _add(attrs, p, vs, ve)
        elif field == 2:
            f.start = _scalar(p, e, &pos, wt, 1)
        elif field == 3:
            f.ns = _scalar(p, e, &pos, wt, 1)
        elif field == 4:
            f.count = _scalar(p, e, &pos, wt, 1)
        elif field == 5:
            f.total = _scalar(p, e, &pos, wt, 1)
            f.has_sum = True
        elif field == 6:
            f.scale = _scalar(p, e, &pos, wt, 0)
        elif field == 7:
            f.zero_count = _scalar(p, e, &pos, wt, 1)
        elif field == 8 or field == 9:
            if (f.has_pos if field == 8 else f.has_neg):
                _refer("a point sends its buckets twice (protobuf merges them)")
            if field == 8:
                f.has_pos = True
                _len(p, e, &pos, wt, &f.ps, &f.pe)
            else:
                f.has_neg = True
                _len(p, e, &pos, wt, &f.ns_, &f.ne_)
        elif field == 10:
            f.flags = _scalar(p, e, &pos, wt, 0)
        elif field == 12:
            f.low = _scalar(p, e, &pos, wt, 1)
            f.has_min = True
        elif field == 13:
            f.high = _scalar(p, e, &pos, wt, 1)
            f.has_max = True
        elif field == 14:
            f.zero_threshold = _scalar(p, e, &pos, wt, 1)
        else:  # 11 exemplars: read when written
            _skip(p, e, &pos, wt)
    return 0


cdef int _exponential_point(Buf* b, Wire p, Py_ssize_t s, Py_ssize_t e, Metric* m
                            ) except -1:
    """An ``ExponentialHistogramDataPoint``'s members after its metric's
    (:func:`icefloe.otlp.metric_rows._exponential_histogram`), each after a comma."""
    cdef ExpFields f
    cdef Entries attrs
    memset(&f, 0, sizeof(ExpFields))
    attrs.items = NULL
    attrs.n = attrs.cap = 0
    try:
        _read_exponential(&f, &attrs, p, s, e)
        if (f.ns > _LONG_MAX or f.start > _LONG_MAX or f.count > _LONG_MAX
                or f.zero_count > _LONG_MAX):
            _refer("a point's time or count is past 2^63 (the reference rejects it)")
        _point_head(b, p, f.ns, f.start, &attrs, f.flags)
        _put_key_uint(b, b',"count":', f.count)
        _put_optional(b, b',"sum":', f.has_sum, f.total)
        _put_optional(b, b',"min":', f.has_min, f.low)
        _put_optional(b, b',"max":', f.has_max, f.high)
        _lit(b, b',"scale":')
        _put_int(b, _zigzag32(f.scale))
        _put_key_uint(b, b',"zero_count":', f.zero_count)
        _put_optional(b, b',"zero_threshold":', True, f.zero_threshold)
        _buckets(b, b',"positive_offset":', b',"positive_bucket_counts":', p, f.has_pos,
                 f.ps, f.pe)
        _buckets(b, b',"negative_offset":', b',"negative_bucket_counts":', p, f.has_neg,
                 f.ns_, f.ne_)
        _lit(b, b',"aggregation_temporality":')
        _put_enum(b, _TEMPORALITIES, m.temporality)
        _put_items(b, b',"exemplars":', p, s, e, 11, _exemplar)
    finally:
        _free_entries(&attrs)
    return 0


cdef int _read_metric(Buf* head, Metric* m, Wire p, Py_ssize_t s, Py_ssize_t e) except -1:
    """A ``Metric``'s columns into ``head`` and its data (gauge or sum; any other data, none,
    or two data members go to the reference)."""
    cdef Py_ssize_t pos = s, ns = 0, ne = 0, dss = 0, dse = 0, us = 0, ue = 0, vs, ve
    cdef uint32_t field
    cdef int wt
    cdef Entries meta
    meta.items = NULL
    meta.n = meta.cap = 0
    m.kind = 0
    try:
        while pos < e:
            _tag(p, e, &pos, &field, &wt)
            if field == 1:
                _string(p, e, &pos, wt, &ns, &ne)
            elif field == 2:
                _string(p, e, &pos, wt, &dss, &dse)
            elif field == 3:
                _string(p, e, &pos, wt, &us, &ue)
            elif field == 5 or field == 7 or field == 9 or field == 10 or field == 11:
                if m.kind:
                    _refer("a metric sends data twice (protobuf merges or replaces it)")
                m.kind = field
                _len(p, e, &pos, wt, &m.ds, &m.de)
            elif field == 12:
                _len(p, e, &pos, wt, &vs, &ve)
                _add(&meta, p, vs, ve)
            else:
                _skip(p, e, &pos, wt)
        if m.kind == 0:
            _refer("a metric without data (the reference rejects it)")
        head.size = 0
        _put_key_str(head, b',"metric_name":', p, ns, ne)
        _put_key_str(head, b',"metric_description":', p, dss, dse)
        _put_key_str(head, b',"metric_unit":', p, us, ue)
        _lit(head, b',"metric_metadata":')
        _put_attributes(head, p, &meta)
    finally:
        _free_entries(&meta)
    return 0


cdef int _read_data(Metric* m, Wire p) except -1:
    """A Gauge's or Sum's scalars (the points, field 1, are read when written)."""
    cdef Py_ssize_t pos = m.ds, vs, ve
    cdef uint32_t field
    cdef int wt
    m.temporality = m.monotonic = 0
    while pos < m.de:
        _tag(p, m.de, &pos, &field, &wt)
        if field == 1:
            _len(p, m.de, &pos, wt, &vs, &ve)
        elif field == 2 and (m.kind == 7 or m.kind == 9 or m.kind == 10):
            m.temporality = _scalar(p, m.de, &pos, wt, 0)
        elif field == 3 and m.kind == 7:
            m.monotonic = _scalar(p, m.de, &pos, wt, 0)
        else:
            _skip(p, m.de, &pos, wt)
    return 0


cdef int _metric_rows(dict rows, Wire p, Py_ssize_t s, Py_ssize_t e, Buf* head, Buf* tail,
                      Buf* out) except -1:
    """Each point of one ``Metric`` as a row of its kind, onto ``rows``."""
    cdef Metric m
    cdef Py_ssize_t pos, ps, pe
    cdef uint32_t field
    cdef int wt
    cdef bytes found
    cdef list kind_rows = None
    _read_metric(head, &m, p, s, e)
    _read_data(&m, p)
    pos = m.ds
    while pos < m.de:
        _tag(p, m.de, &pos, &field, &wt)
        if field != 1:
            _skip(p, m.de, &pos, wt)
            continue
        _len(p, m.de, &pos, wt, &ps, &pe)
        out.size = 0
        _put(out, head.data, head.size)
        if m.kind == 9:
            _histogram_point(out, p, ps, pe, &m)
        elif m.kind == 10:
            _exponential_point(out, p, ps, pe, &m)
        elif m.kind == 11:
            _summary_point(out, p, ps, pe, &m)
        else:
            _number_point(out, p, ps, pe, &m)
        out.data[0] = b'{'
        found = PyBytes_FromStringAndSize(NULL, out.size + tail.size)
        memcpy(PyBytes_AS_STRING(found), out.data, out.size)
        memcpy(PyBytes_AS_STRING(found) + out.size, tail.data, tail.size)
        if kind_rows is None:
            kind_rows = rows.setdefault(_METRIC_KINDS[m.kind], [])
        kind_rows.append(found)
    return 0


cdef int _scope_metrics(dict rows, Wire p, Py_ssize_t s, Py_ssize_t e, Buf* res, Buf* head,
                        Buf* tail, Buf* out) except -1:
    cdef bint has
    cdef Py_ssize_t hs = 0, he = 0, us, ue, pos = s, ms, me
    cdef uint32_t field
    cdef int wt
    _heads(p, s, e, &has, &hs, &he, &us, &ue)
    tail.size = 0
    _put(tail, res.data, res.size)
    _scope_part(tail, p, has, hs, he, us, ue)
    while pos < e:
        _tag(p, e, &pos, &field, &wt)
        if field != 2:
            _skip(p, e, &pos, wt)
            continue
        _len(p, e, &pos, wt, &ms, &me)
        _metric_rows(rows, p, ms, me, head, tail, out)
    return 0


def metric_rows(bytes body):
    """The canonical rows per kind (``export_rows("metrics", ..., canonical=True).rows``) of
    an ``ExportMetricsServiceRequest``'s wire bytes.
    Raises :class:`Reference` when only the reference path can tell (see the module's doc)."""
    cdef Wire p = <Wire>PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body), pos = 0, s, e, rpos, hs = 0, he = 0, us, ue
    cdef Py_ssize_t ss, se
    cdef uint32_t field
    cdef int wt
    cdef bint has
    cdef dict rows = {}
    cdef Buf res, head, tail, out
    memset(&res, 0, sizeof(Buf))
    memset(&head, 0, sizeof(Buf))
    memset(&tail, 0, sizeof(Buf))
    memset(&out, 0, sizeof(Buf))
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
                _scope_metrics(rows, p, ss, se, &res, &head, &tail, &out)
    finally:
        free(res.data)
        free(head.data)
        free(tail.data)
        free(out.data)
    return rows
