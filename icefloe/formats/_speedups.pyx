# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled inner loops of the ingestor's hot path (optional: Cython, built by ``make``).

Why: for a 100-event gRPC call or HTTP batch, framing the records and checking their
timestamps were ~26 µs of per-event Python on the event loop, which is what bounds an
ingestor's throughput (measured: 19 → 1.2 µs and 6.7 → 1.1 µs per 100 events). The
pure-Python versions in :mod:`icefloe.formats.envelope` and :mod:`ingestor.validate` stay the
reference: they run wherever this module is not built, and the tests hold both to the same
results.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.datetime cimport datetime, datetime_tzinfo, import_datetime
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

import_datetime()

cdef uint64_t _U32_MAX = 0xFFFFFFFF


def frame(bytes prefix, bytes stem, ids, list payloads, bytes tail):
    """The framed records ``[u32 length][prefix][u8 id length][stem + ids[i]][tail]
    [payloads[i]]`` for each payload, as one ``bytes``.

    ``ids`` (a list or tuple of ``bytes``) may be longer than ``payloads``: the cached
    suffix tuples are passed whole. Raises ``ValueError`` for an id over 255 bytes or a
    record over the u32 range, ``TypeError`` for an element that is not ``bytes``.
    """
    cdef Py_ssize_t n = len(payloads), i, total = 0, idlen, size
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(prefix), slen = PyBytes_GET_SIZE(stem)
    cdef Py_ssize_t tlen = PyBytes_GET_SIZE(tail)
    cdef uint64_t record
    cdef bytes payload, suffix
    cdef char* out
    if len(ids) < n:
        raise ValueError(f"{len(ids)} event ids for {n} payloads")
    for i in range(n):  # sizes and checks first: nothing is written for a bad request
        suffix = <bytes?>ids[i]
        payload = <bytes?>payloads[i]
        idlen = slen + PyBytes_GET_SIZE(suffix)
        if idlen > 255:
            raise ValueError(f"event id of {idlen} bytes: at most 255 fit")
        record = plen + 1 + idlen + tlen + PyBytes_GET_SIZE(payload)
        if record > _U32_MAX:
            raise ValueError(f"a record of {record} bytes does not fit a u32 length")
        total += 4 + <Py_ssize_t>record
    framed = PyBytes_FromStringAndSize(NULL, total)
    out = PyBytes_AS_STRING(framed)
    for i in range(n):
        suffix = <bytes>ids[i]
        payload = <bytes>payloads[i]
        idlen = slen + PyBytes_GET_SIZE(suffix)
        size = PyBytes_GET_SIZE(payload)
        record = plen + 1 + idlen + tlen + size
        out[0] = <char>(record & 0xFF)
        out[1] = <char>((record >> 8) & 0xFF)
        out[2] = <char>((record >> 16) & 0xFF)
        out[3] = <char>((record >> 24) & 0xFF)
        out += 4
        memcpy(out, PyBytes_AS_STRING(prefix), plen)
        out += plen
        out[0] = <char>idlen
        out += 1
        memcpy(out, PyBytes_AS_STRING(stem), slen)
        out += slen
        memcpy(out, PyBytes_AS_STRING(suffix), PyBytes_GET_SIZE(suffix))
        out += PyBytes_GET_SIZE(suffix)
        memcpy(out, PyBytes_AS_STRING(tail), tlen)
        out += tlen
        memcpy(out, PyBytes_AS_STRING(payload), size)
        out += size
    return framed


def not_utc(list events, str name, object utc):
    """Indexes of the events whose attribute ``name`` is not a ``datetime`` in ``utc``
    (exactly that tzinfo object): the ones that need converting."""
    cdef list found = []
    cdef Py_ssize_t i
    cdef object value
    for i in range(len(events)):
        value = getattr(events[i], name)
        if type(value) is not datetime or datetime_tzinfo(value) is not utc:
            found.append(i)
    return found


cdef long long _zigzag(const unsigned char* p, Py_ssize_t end, Py_ssize_t* pos,
                      str what) except? -1:
    """A zig-zag varint of a Kafka record (ValueError naming ``what`` past ``end`` or over
    10 bytes)."""
    cdef unsigned long long value = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= end:
            raise ValueError(f"{what} at byte {pos[0]} runs past its record")
        b = p[pos[0]]
        pos[0] += 1
        value |= (<unsigned long long>(b & 0x7F)) << shift
        if not (b & 0x80):
            break
        shift += 7
        if shift > 63:
            raise ValueError(f"{what} ending at byte {pos[0]} is longer than 10 bytes")
    return <long long>((value >> 1) ^ (0 - (value & 1)))


cdef object _field(const unsigned char* p, Py_ssize_t end, Py_ssize_t* pos, str what):
    cdef long long size = _zigzag(p, end, pos, what + " length")
    cdef object out
    if size == -1:
        return None
    if size < -1 or pos[0] + size > end:
        raise ValueError(f"{what} length {size} at byte {pos[0]} runs past its record")
    out = PyBytes_FromStringAndSize(<const char*>p + pos[0], <Py_ssize_t>size)
    pos[0] += <Py_ssize_t>size
    return out


def kafka_records(bytes data, Py_ssize_t count, long long base_ts, bint log_append,
                  long long max_ts, bint meta=True):
    """The records of a decompressed Kafka record batch as four lists (values, keys,
    timestamps, headers): :func:`ingestor.kafka.records._read_records`, compiled (~10x).
    ``meta`` False checks keys and headers as always but leaves those three lists empty
    (most streams map no Kafka metadata: a quarter of the parse is building them).
    Raises ``ValueError`` naming the first inconsistency."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), pos = 0, end, i, h
    cdef long long length, stamp, nheaders
    cdef list values = [], keys = [], stamps = [], headers = [], pairs
    cdef object name, key
    for i in range(count):
        length = _zigzag(p, n, &pos, "record length")
        if length <= 0 or pos + length > n:
            raise ValueError(f"record {i} says {length} bytes; {n - pos} are left")
        end = pos + <Py_ssize_t>length
        pos += 1  # attributes (unused)
        stamp = _zigzag(p, end, &pos, "timestamp delta")
        if _zigzag(p, end, &pos, "offset delta") != i:
            raise ValueError(f"record {i} has an offset delta other than {i}")
        key = _field(p, end, &pos, "key")
        values.append(_field(p, end, &pos, "value"))
        nheaders = _zigzag(p, end, &pos, "header count")
        if nheaders < 0 or nheaders > 100000:
            raise ValueError(f"record {i} has a header count of {nheaders}")
        pairs = [] if meta or nheaders else None
        for h in range(nheaders):
            name = _field(p, end, &pos, "header key")
            if name is None:
                raise ValueError(f"record {i} has a header without a name")
            try:
                pairs.append(((<bytes>name).decode(), _field(p, end, &pos, "header value")))
            except UnicodeDecodeError:
                raise ValueError(f"record {i} has a header name that is not UTF-8") from None
        if pos != end:
            raise ValueError(f"record {i} says {length} bytes but its fields take "
                             f"{length + pos - end}")
        if meta:
            keys.append(key)
            headers.append(pairs)
            stamps.append(max_ts if log_append else base_ts + stamp)
    if pos != n:
        raise ValueError(f"{n - pos} bytes follow the batch's {count} records")
    return values, keys, stamps, headers


def decimal_suffixes(long long start, Py_ssize_t count):
    """``[b"%d" % ((start + i) & 0x7FFFFFFF) for i in range(count)]``: the Kafka listener's
    sequence ids (:func:`ingestor.kafka.produce.sequence_ids`), ~3x faster."""
    cdef list out = [None] * count
    cdef char digits[24]
    cdef Py_ssize_t i, n
    cdef long long value
    for i in range(count):
        value = (start + i) & 0x7FFFFFFF
        n = 24
        while True:
            n -= 1
            digits[n] = <char>(48 + value % 10)
            value //= 10
            if value == 0:
                break
        out[i] = PyBytes_FromStringAndSize(digits + n, 24 - n)
    return out


cdef Py_ssize_t _length(const unsigned char* p, Py_ssize_t end, Py_ssize_t* pos):
    """A length-delimited field's length (a varint of at most 5 bytes, the slice inside
    ``end``), or -1 when it is anything else (the caller then leaves the parse to
    protobuf)."""
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= end or shift > 28:
            return -1
        b = p[pos[0]]
        pos[0] += 1
        value |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            break
        shift += 7
    if <uint64_t>(end - pos[0]) < value:
        return -1
    return <Py_ssize_t>value


def publish_request(bytes data):
    """A serialized ``icefloe.v1.PublishRequest`` as ``(stream, request_id, jsons,
    event_ids, datas)`` (``event_ids``/``datas`` None when no event sets one), or None for
    anything but the plain encoding a client sends: an unknown field, another wire type, a
    field of an ``Event`` given twice, a string that is not UTF-8, a truncated message.
    None is no verdict: the caller decodes
    such bytes with protobuf, which answers them (or refuses them) as it always did, so
    this parse only ever agrees with protobuf (``tests/ingestor/test_grpc_parse.py``).

    Why: the protobuf message's wrappers cost ~15 µs per 100-event call on the event loop
    (an ``Event`` object per event, then two attribute reads each); this reads the three
    fields straight into the lists the ingestor uses.
    """
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), pos = 0, size, end, count = 0
    cdef str stream = "", request_id = ""
    cdef Py_ssize_t json_at, json_size, id_at, id_size, data_at, data_size
    cdef unsigned char tag, seen
    cdef list jsons = []
    cdef list ids = None
    cdef list datas = None
    try:
        while pos < n:
            tag = p[pos]
            pos += 1
            size = _length(p, n, &pos)
            if size < 0:
                return None
            if tag == 0x12:  # events (2, length-delimited): one Event
                end = pos + size
                json_at = json_size = id_at = id_size = data_at = data_size = 0
                seen = 0
                while pos < end:
                    tag = p[pos]
                    pos += 1
                    size = _length(p, end, &pos)
                    if size < 0 or (tag == 0x0A and seen & 1) or (tag == 0x12 and seen & 2) \
                            or (tag == 0x1A and seen & 4):
                        return None  # (a repeated field: protobuf judges every copy)
                    if tag == 0x0A:  # json (1, bytes)
                        json_at, json_size, seen = pos, size, seen | 1
                    elif tag == 0x12:  # event_id (2, string)
                        id_at, id_size, seen = pos, size, seen | 2
                    elif tag == 0x1A:  # data (3, bytes)
                        data_at, data_size, seen = pos, size, seen | 4
                    else:
                        return None
                    pos += size
                jsons.append(PyBytes_FromStringAndSize(<const char*>p + json_at, json_size))
                if id_size:
                    if ids is None:
                        ids = [""] * count
                    ids.append((<const char*>p + id_at)[:id_size].decode("utf-8"))
                elif ids is not None:
                    ids.append("")
                if data_size:
                    if datas is None:
                        datas = [b""] * count
                    datas.append(PyBytes_FromStringAndSize(<const char*>p + data_at,
                                                           data_size))
                elif datas is not None:
                    datas.append(b"")
                count += 1
                continue
            # a field given twice: every copy must be UTF-8, and the last one counts
            if tag == 0x0A:  # stream (1, string)
                stream = (<const char*>p + pos)[:size].decode("utf-8")
            elif tag == 0x1A:  # request_id (3, string)
                request_id = (<const char*>p + pos)[:size].decode("utf-8")
            else:
                return None
            pos += size
    except UnicodeDecodeError:
        return None
    return stream, request_id, jsons, ids, datas
