"""Change streams (#42): Debezium's documented change events (PostgreSQL, MySQL; bare and
inside the JSON converter's schema/payload wrapper) and plain op events flattened into the
rows the upsert applies; config refusals named by key."""

from __future__ import annotations

import base64
import textwrap

import pytest
from config_support import HEADER, load_text

from icefloe.errors import ConfigError
from icefloe.streams.cdc import (
    DELETED_COLUMN,
    OP_COLUMN,
    POSITION_COLUMN,
    ChangeError,
    Flattener,
    encode_position,
)

STREAM = HEADER + textwrap.dedent("""
    [[streams]]
    name = "customers"
    table = "inventory.customers"
    columns = [
      { name = "id", type = "long", required = true },
      { name = "first_name", type = "string" },
      { name = "email", type = "string" },
    ]
    primary_key = ["id"]
""")

# The shapes Debezium documents (PostgreSQL connector, "update" event; MySQL connector,
# "create" event), trimmed to the fields icefloe reads plus the rest of `source` as shown.
PG_UPDATE = {
    "before": {"id": 1, "first_name": "Anne", "email": "annek@noanswer.org"},
    "after": {"id": 1, "first_name": "Anne Marie", "email": "annek@noanswer.org"},
    "source": {"version": "2.7.0.Final", "connector": "postgresql", "name": "PostgreSQL_server",
               "ts_ms": 1559033904863, "snapshot": "false", "db": "postgres",
               "schema": "public", "table": "customers", "txId": 556, "lsn": 24023128,
               "xmin": None},
    "op": "u", "ts_ms": 1465584025523,
}
MYSQL_CREATE = {
    "before": None,
    "after": {"id": 1004, "first_name": "Anne", "email": "annek@noanswer.org"},
    "source": {"version": "2.7.0.Final", "connector": "mysql", "name": "mysql-server-1",
               "ts_ms": 0, "snapshot": "false", "db": "inventory", "table": "customers",
               "server_id": 0, "gtid": None, "file": "mysql-bin.000003", "pos": 154,
               "row": 0, "thread": 7, "query": "INSERT INTO customers ..."},
    "op": "c", "ts_ms": 1486500577691,
}


def flattener(tmp_path, extra: str = "cdc = {}\n") -> Flattener:
    return Flattener(load_text(tmp_path, STREAM + extra).streams[0])


def test_should_take_a_postgresql_update_bare_and_wrapped(tmp_path):
    flat = flattener(tmp_path, 'cdc = { before_columns = ["first_name"] }\n')
    row, event_id = flat.flatten(PG_UPDATE)
    assert row == {"id": 1, "first_name": "Anne Marie", "email": "annek@noanswer.org",
                   "before_first_name": "Anne", OP_COLUMN: "u",
                   POSITION_COLUMN: encode_position([24023128, 556]), DELETED_COLUMN: False}
    wrapped = flat.flatten({"schema": {"type": "struct", "fields": []}, "payload": PG_UPDATE})
    assert wrapped == (row, event_id)  # same change, same id: a re-delivery dedups
    assert event_id.startswith("cdc:" + encode_position([24023128, 556]) + ":")


def test_should_order_mysql_positions_by_file_then_offset_then_row(tmp_path):
    flat = flattener(tmp_path)
    row, _ = flat.flatten(MYSQL_CREATE)
    assert row[POSITION_COLUMN] == encode_position([3, 154, 0])
    later = {**MYSQL_CREATE, "source": {**MYSQL_CREATE["source"], "file": "mysql-bin.000010",
                                        "pos": 4, "row": 2}}
    assert flat.flatten(later)[0][POSITION_COLUMN] > row[POSITION_COLUMN]


def test_a_delete_keeps_the_key_from_before_and_a_snapshot_read_is_a_row(tmp_path):
    flat = flattener(tmp_path)
    delete = {**PG_UPDATE, "op": "d", "after": None}
    row, _ = flat.flatten(delete)
    assert row == {"id": 1, OP_COLUMN: "d", POSITION_COLUMN: encode_position([24023128, 556]),
                   DELETED_COLUMN: True}
    read = {**MYSQL_CREATE, "op": "r", "source": {**MYSQL_CREATE["source"], "snapshot": "true"}}
    assert flat.flatten(read)[0][OP_COLUMN] == "r"


def test_a_key_update_gives_two_changes_with_two_ids(tmp_path):
    flat = flattener(tmp_path)
    gone = {**PG_UPDATE, "op": "d", "after": None}
    new = {**PG_UPDATE, "op": "c", "before": None, "after": {**PG_UPDATE["after"], "id": 2}}
    (_, a), (_, b) = flat.flatten(gone), flat.flatten(new)
    assert a != b


def test_a_change_without_a_key_keeps_no_key_for_the_collector_to_dead_letter(tmp_path):
    row, _ = flattener(tmp_path).flatten({**PG_UPDATE, "op": "d", "before": None,
                                          "after": None})
    assert "id" not in row


def test_null_events_are_none_and_wrong_events_refused_by_field(tmp_path):
    flat = flattener(tmp_path)
    assert flat.flatten(None) is None
    assert flat.flatten({"schema": {}, "payload": None}) is None
    cases = [({**PG_UPDATE, "op": "t"}, "op", "truncate"),
             ({**PG_UPDATE, "op": "x"}, "op", "not a change operation"),
             ({**PG_UPDATE, "after": None}, "after", "null"),
             ({**PG_UPDATE, "source": {"connector": "sqlserver"}}, "source.connector",
              "no known position"),
             ({**PG_UPDATE, "source": {"connector": "postgresql", "lsn": -4}},
              "$.source.lsn", "negative"),
             ({**PG_UPDATE, "after": {**PG_UPDATE["after"], "_cdc_op": "x"}}, "_cdc_op",
              "cdc sets")]
    for event, field, reason in cases:
        with pytest.raises(ChangeError, match=reason) as info:
            flat.flatten(event)
        assert info.value.field == field


def test_plain_op_events_map_values_and_positions(tmp_path):
    flat = flattener(tmp_path, 'cdc = { format = "op", op_field = "kind", position = '
                               '["$.seq"], ops = { INSERT = "c", DELETE = "d" } }\n')
    row, _ = flat.flatten({"kind": "INSERT", "id": 5, "first_name": "x", "seq": 7})
    assert row[OP_COLUMN] == "c"
    assert row["seq"] == 7
    assert "kind" not in row
    assert row[POSITION_COLUMN] == encode_position([7])
    with pytest.raises(ChangeError, match=r"not an operation of cdc\.ops"):
        flat.flatten({"kind": "UPSERT", "id": 5, "seq": 8})


def test_the_stream_gets_its_columns_and_tombstone(tmp_path):
    stream = load_text(tmp_path, STREAM + 'cdc = { before_columns = ["email"] }\n').streams[0]
    names = [c.name for c in stream.columns]
    assert names[-4:] == [OP_COLUMN, POSITION_COLUMN, DELETED_COLUMN, "before_email"]
    assert stream.tombstone_field == DELETED_COLUMN


@pytest.mark.parametrize(("extra", "message"), [
    ('tombstone_field = "x"\ncdc = {}\n', r"streams\[0\]\.tombstone_field: not with cdc"),
    ('cdc = { position = "oracle" }\n', r"streams\[0\]\.cdc\.position: 'oracle'"),
    ('cdc = { format = "op" }\n', r"cdc\.position: 'auto': give JSON paths"),
    ('cdc = { format = "op", position = ["$.a"], ops = { X = "z" } }\n',
     r"cdc\.ops\.X: 'z' is not an operation"),
    ('cdc = { ops = { X = "c" } }\n', r"cdc\.ops: only for format = \"op\""),
    ('cdc = { before_columns = ["nope"] }\n', r"cdc\.before_columns\[0\]: 'nope'"),
    ('cdc = { position = ["nope"] }\n', r"cdc\.position\[0\]: 'nope'"),
    ('cdc = { lsn = 1 }\n', r"cdc"),
    ('cdc = { deletes = "soft" }\n', r"streams\[0\]\.cdc\.deletes"),
    ('where = "email = \'x\'"\ncdc = {}\n', r"streams\[0\]\.where: not with cdc: a delete"),
])
def test_should_refuse_bad_cdc_settings_by_key(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        load_text(tmp_path, STREAM + extra)


def test_should_refuse_required_non_key_columns_and_a_missing_key(tmp_path):
    text = STREAM.replace('"first_name", type = "string"',
                          '"first_name", type = "string", required = true')
    with pytest.raises(ConfigError, match=r"columns\[1\]\.required: only key columns"):
        load_text(tmp_path, text + "cdc = {}\n")
    with pytest.raises(ConfigError, match=r"streams\[0\]\.cdc: .*set primary_key"):
        load_text(tmp_path, STREAM.replace('primary_key = ["id"]', "") + "cdc = {}\n")


def test_debezium_temporal_encodings_are_read_through_the_schema(tmp_path):
    """PostgreSQL's timestamp as MicroTimestamp, date as Date (days), time as MicroTime:
    with the JSON converter's schema they become the text each column type takes."""
    text = STREAM.replace('{ name = "email", type = "string" },',
                          '{ name = "email", type = "string" },\n'
                          '  { name = "seen", type = "timestamp" },\n'
                          '  { name = "born", type = "date" },\n'
                          '  { name = "at", type = "time" },\n'
                          '  { name = "raw_us", type = "long" },')
    flat = Flattener(load_text(tmp_path, text + 'cdc = { before_columns = ["born"] }\n')
                     .streams[0])
    fields = [{"field": "id", "type": "int64"},
              {"field": "seen", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
              {"field": "born", "type": "int32", "name": "io.debezium.time.Date"},
              {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTime"},
              {"field": "raw_us", "type": "int64", "name": "io.debezium.time.MicroTimestamp"}]
    schema = {"type": "struct", "fields": [{"field": "before", "type": "struct",
                                            "fields": fields},
                                           {"field": "after", "type": "struct",
                                            "fields": fields}]}
    image = {"id": 1, "seen": -86_400_000_001, "born": -3653, "at": 45_296_000_001,
             "raw_us": 7}
    event = {**PG_UPDATE, "before": image, "after": image}
    row, _ = flat.flatten({"schema": schema, "payload": event})
    assert row["seen"] == "1969-12-30T23:59:59.999999Z"
    assert row["born"] == "1960-01-01"
    assert row["before_born"] == "1960-01-01"
    assert row["at"] == "12:34:56.000001"
    assert row["raw_us"] == 7  # a long column keeps the number
    bare, _ = flat.flatten(event)
    assert bare["seen"] == -86_400_000_001  # no schema: nothing guessed (docs/cdc.md)


def test_debeziums_unavailable_value_placeholder_is_refused_naming_the_column(tmp_path):
    """An update of a PostgreSQL row whose TOASTed column did not change, without REPLICA
    IDENTITY FULL: Debezium sends a placeholder instead of the value. Stored, it would
    overwrite the row's real value, so the change is refused naming the column and the fix;
    an undeclared column holding it is ignored like any undeclared field."""
    flat = flattener(tmp_path, 'cdc = { before_columns = ["first_name"] }\n')
    placeholder = "__debezium_unavailable_value"
    as_bytes = base64.b64encode(placeholder.encode()).decode()
    for value in (placeholder, as_bytes, [placeholder]):
        event = {**PG_UPDATE, "after": {**PG_UPDATE["after"], "email": value}}
        with pytest.raises(ChangeError, match=r"email holds Debezium's placeholder.*"
                                              r"REPLICA IDENTITY FULL") as info:
            flat.flatten(event)
        assert info.value.field == "email"
    before = {**PG_UPDATE, "before": {**PG_UPDATE["before"], "first_name": placeholder}}
    with pytest.raises(ChangeError) as info:
        flat.flatten(before)
    assert info.value.field == "before.first_name"
    undeclared = {**PG_UPDATE, "after": {**PG_UPDATE["after"], "bio": placeholder}}
    row, _ = flat.flatten(undeclared)
    assert row["bio"] == placeholder  # not a column: never lands (decode drops it)
    deleted = {**PG_UPDATE, "op": "d", "after": None,
               "before": {"id": 1, "first_name": None, "email": placeholder}}
    assert flat.flatten(deleted)[0]["id"] == 1  # a delete keeps only the key
