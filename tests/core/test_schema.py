"""Stream schema compilation: every column type, canonical form, per-event violations."""

from __future__ import annotations

import pytest

from icefloe.config import Column, StreamConfig
from ingestor.validate import CompiledStream, InvalidEvents


def compiled(*columns: Column, **options) -> CompiledStream:
    return CompiledStream(StreamConfig(name="s", table="ns.t", columns=columns, **options))


def test_should_allow_required_columns_after_optional_ones():
    stream = compiled(Column("a", "string"), Column("b", "string", required=True))
    assert stream.from_json(b'{"b":"x"}').payloads == [b'{"b":"x"}']
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(b'{"a":"x"}')
    assert info.value.violations[0].field == "b"


@pytest.mark.parametrize(("kind", "given", "stored"), [
    ("string", b'"x"', b'"x"'),
    ("long", b"9007199254740993", b"9007199254740993"),
    ("int", b"-2147483648", b"-2147483648"),
    ("double", b"1.5", b"1.5"),
    ("double", b"2", b"2.0"),
    ("float", b"0.25", b"0.25"),
    ("boolean", b"true", b"true"),
    ("timestamp", b'"2026-11-23T10:00:00.5+01:00"', b'"2026-11-23T09:00:00.500000Z"'),
    ("timestamp", b"1795428000123", b'"2026-11-23T10:00:00.123000Z"'),
    ("date", b'"2026-02-28"', b'"2026-02-28"'),
    ("json", b'{"k":[1,{"x":null}]}', b'"{\\"k\\":[1,{\\"x\\":null}]}"'),
    ("json", b"[1,2]", b'"[1,2]"'),
])
def test_should_store_each_type_in_canonical_form(kind, given, stored):
    stream = compiled(Column("v", kind))
    assert stream.from_json(b'{"v":' + given + b"}").payloads == [b'{"v":' + stored + b"}"]


@pytest.mark.parametrize(("kind", "given", "reason"), [
    ("string", b"12", "got `int`"),
    ("long", b'"12"', "got `str`"),
    ("int", b"2147483648", "expected `int` <= 2147483647"),
    ("double", b'"1.5"', "got `str`"),
    ("boolean", b"1", "got `int`"),
    ("timestamp", b'"2026-11-23T10:00:00"', "timezone"),
    ("timestamp", b'"yesterday"', "invalid RFC3339"),
    ("date", b'"2026-02-30"', "invalid"),
])
def test_should_refuse_wrong_types_naming_the_field(kind, given, reason):
    stream = compiled(Column("v", kind))
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(b'[{"v":' + given + b"}]")
    violation = info.value.violations[0]
    assert (violation.index, violation.field) == (0, "v")
    assert reason in violation.reason


def test_should_drop_or_reject_unknown_fields_per_policy():
    assert compiled(Column("a", "string")).from_json(b'{"a":"x","b":1}').payloads == \
        [b'{"a":"x"}']
    with pytest.raises(InvalidEvents) as info:
        compiled(Column("a", "string"), unknown_fields="reject").from_json(b'{"a":"x","b":1}')
    assert info.value.violations[0].field == "b"


def test_should_list_every_bad_event_of_a_request():
    stream = compiled(Column("a", "long", required=True))
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(b'[{"a":1},{"a":"x"},{"a":2},{},{"a":3}]')
    assert [(v.index, v.field) for v in info.value.violations] == [(1, "a"), (3, "a")]
    assert info.value.code == "validation_failed"


def test_should_take_event_ids_from_the_id_field():
    stream = compiled(Column("id", "string"), Column("n", "long"), event_id_field="id")
    assert stream.from_ndjson(b'{"id":"a"}\n{"n":1}\n').body_ids == ["a", None]


def test_should_report_range_problems_alongside_type_problems():
    stream = compiled(Column("a", "long"), Column("ts", "timestamp"))
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(b'[{"a":"x"},{"ts":99999999999999999}]')
    assert [(v.index, v.field) for v in info.value.violations] == [(0, "a"), (1, "ts")]


def test_should_normalize_every_timestamp_form_within_one_request():
    """The bulk check skips UTC datetimes: the others in the same request still convert."""
    stream = compiled(Column("ts", "timestamp"), Column("n", "long"))
    canonical = stream.from_json(
        b'[{"ts":"2026-11-23T10:00:00Z"},{"ts":"2026-11-23T10:00:00+01:00"},'
        b'{"ts":1795428000123},{"n":1},{"ts":"2026-11-23T10:00:00.5+00:00"},{"ts":null}]')
    assert canonical.payloads == [
        b'{"ts":"2026-11-23T10:00:00Z"}', b'{"ts":"2026-11-23T09:00:00Z"}',
        b'{"ts":"2026-11-23T10:00:00.123000Z"}', b'{"n":1}',
        b'{"ts":"2026-11-23T10:00:00.500000Z"}', b"{}"]


def test_should_report_every_out_of_range_timestamp_of_a_request_by_index():
    stream = compiled(Column("ts", "timestamp"))
    with pytest.raises(InvalidEvents) as info:
        stream.from_events([b'{"ts":"2026-11-23T10:00:00Z"}', b'{"ts":99999999999999999}',
                            b'{"ts":1}', b'{"ts":-99999999999999999}'])
    assert [(v.index, v.field) for v in info.value.violations] == [(1, "ts"), (3, "ts")]
    assert all("out of range" in v.reason for v in info.value.violations)


@pytest.mark.parametrize("events", [
    [b'{"a":"x"},{"a":"', b'"}'],  # a string spanning the separator
    [b'{"a":"x"},{"b":[2', b'3]}'],  # a list spanning it
    [b'{"a":"x"},{"a":"y"}', b""],  # two objects in one, then an empty one
])
def test_should_refuse_events_that_only_join_into_valid_json(events):
    """Each event must be one JSON object on its own: joined with commas, these read as
    two valid objects no producer sent (NDJSON lines, gRPC Event.json, Kafka values)."""
    stream = compiled(Column("a", "string"), Column("b", "json"))
    with pytest.raises(InvalidEvents) as info:
        stream.from_events(events)
    assert {v.index for v in info.value.violations} <= {0, 1}
    assert info.value.violations
    with pytest.raises(InvalidEvents):
        stream.from_ndjson(b"\n".join(events))
