# Reading the protobuf wire format, AnyValue and key/value lists (and writing them as JSON).
# (included by icefloe/otlp/_wire.pyx: one module, its parts in files of one job)

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
