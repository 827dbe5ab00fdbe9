# Writing JSON: a growable byte buffer and msgspec's escapes, numbers, times and ids.
# (included by icefloe/otlp/_wire.pyx: one module, its parts in files of one job)

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
