# Metric points as rows: gauge, sum, histogram, exponential histogram and summary.
# (included by icefloe/otlp/_wire.pyx: one module, its parts in files of one job)

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
