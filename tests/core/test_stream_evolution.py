"""The inference table and limits of schema evolution from the data (issue #27 item 1):
pure rules, no table library (:mod:`icefloe.streams.evolution`)."""

from __future__ import annotations

import pytest

from icefloe.streams.evolution import (
    ColumnChange,
    EvolveLimits,
    column_value,
    parse_extras,
    plan_run,
)
from icefloe.streams.typespec import parse_type

TABLE = {"user_id": "string", "_event_id": "string", "_received_at": "timestamp",
         "_sequence": "long", "_shard": "int"}
FIXED = set(TABLE)


DEFAULT = EvolveLimits()


def plan(extras, columns=None, limits=DEFAULT):
    return plan_run(extras, {**TABLE, **(columns or {})}, FIXED, limits, table="t")


@pytest.mark.parametrize(("value", "kind"), [
    (5, "long"), (2.5, "double"), (True, "boolean"), ("2026-11-23", "string"),
    ({"a": 1, "b": "x"}, "struct<a:long,b:string>"), ([1, 2], "list<long>"),
    ([{"a": 1}, {"a": 2, "b": True}], "list<struct<a:long,b:boolean>>"),
    ([1, "x"], "json"), ({"not an ident": 1}, "json"), ([], "list<json>"),
])
def test_each_json_value_infers_its_documented_column_type(value, kind):
    result = plan([{"f": value}])
    assert result.changes == [ColumnChange("add", "f", kind)]
    assert result.columns == {"f": kind}
    assert result.refused == {}


def test_null_only_fields_wait_for_a_value():
    assert plan([{"f": None}, {"f": None}]).changes == []
    assert plan([{"f": None}, {"f": 1}]).columns == {"f": "long"}


def test_integers_and_fractions_merge_to_double_but_other_kinds_conflict():
    assert plan([{"f": 1}, {"f": 1.5}]).columns == {"f": "double"}
    mixed = plan([{"f": 1}, {"f": "one"}, {"f": 2}])
    assert mixed.columns == {"f": "long"}
    assert list(mixed.refused) == [1]
    assert "string \"one\" does not fit long" in mixed.refused[1]


def test_objects_whose_shape_varies_become_json():
    assert plan([{"f": {"a": 1}}, {"f": {"a": "x"}}]).columns == {"f": "json"}
    assert plan([{"f": {"a": 1}}, {"f": [1]}]).columns == {"f": "json"}


def test_a_value_that_conflicts_with_an_existing_column_is_refused_never_cast():
    result = plan([{"n": 1.5}, {"n": "7"}, {"n": 7}, {"s": 3}, {"b": 1}],
                  {"n": "long", "s": "string", "b": "boolean"})
    assert result.changes == []
    assert sorted(result.refused) == [0, 1, 3, 4]
    assert "number 1.5 does not fit long" in result.refused[0]
    assert "never cast" in result.refused[0]


def test_int_and_float_columns_widen_instead_of_refusing():
    result = plan([{"i": 2**40}, {"f": 0.1}], {"i": "int", "f": "float"})
    assert result.changes == [ColumnChange("widen", "i", "long"),
                              ColumnChange("widen", "f", "double")]
    assert result.refused == {}
    assert plan([{"f": 0.5}], {"f": "float"}).changes == []  # fits a float as is


def test_names_that_differ_only_in_case_are_refused():
    result = plan([{"User_Id": "x"}, {"plan": "a"}, {"Plan": "b"}])
    assert set(result.refused) == {0, 2}
    assert "'user_id'" in result.refused[0]
    assert "case" in result.refused[0]
    assert result.columns == {"plan": "string"}


def test_reserved_and_non_identifier_names_are_refused():
    result = plan([{"_EVENT_ID": "x"}, {"_icefloe_extra": 1}, {"a-b": 1}, {"9a": 1}])
    assert sorted(result.refused) == [0, 1, 2, 3]
    assert "reserved" in result.refused[0]
    assert "letters, digits" in result.refused[2]


def test_limits_refuse_the_events_beyond_them():
    limits = EvolveLimits(max_columns=len(TABLE) + 1, max_name_length=4, max_depth=2)
    result = plan([{"a": 1}, {"b": 2}, {"longer": 1}, {"c": [[[1]]]}, {"a": 3, "d": None}],
                  limits=limits)
    assert result.columns == {"a": "long"}
    assert "past 6 columns" in result.refused[1]
    assert "evolve_max_name_length" in result.refused[2]
    assert "nests 3 levels" in result.refused[3]
    assert 4 not in result.refused  # a null needs no column


def test_integers_beyond_the_long_range_are_refused():
    [extra] = parse_extras(['{"big": 18446744073709551616}'])
    assert extra == {"big": 2**64}
    result = plan([extra])
    assert result.changes == []
    assert "beyond the long range" in result.refused[0]


def test_column_values_are_arrow_ready():
    assert column_value(3, parse_type("double")) == 3.0
    assert column_value({"a": [1]}, parse_type("json")) == '{"a":[1]}'
    assert column_value({"a": 1}, parse_type("struct<a:long,b:string>")) == {"a": 1, "b": None}
