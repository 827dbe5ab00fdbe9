"""The collector's one-pass decode of an evolving run's undeclared fields (issue #27,
freshness in evolve mode) gives what the rules give when they read every field of every
row: the same columns and values, the same dead letters with the same reasons, whichever
path a run takes (a run without new fields, new fields beside the table's own, a misfit
that makes the columnar read refuse the run, new fields whose shape varies).

The reference is the pure rules of :mod:`icefloe.streams.evolution` over fully decoded
rows (:func:`parse_extras` without ``only``, :func:`plan_run`, :func:`column_value`),
against a real SQLite catalog."""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, TimestamptzType

from collector.evolve import evolve_rows, table_columns
from icefloe.config import Column, StreamConfig
from icefloe.streams.evolution import (
    EXTRA_FIELD,
    RESERVED,
    EvolveLimits,
    column_value,
    parse_extras,
    plan_run,
)
from icefloe.streams.typespec import parse_type
from pipeline.columns import ARROW_TYPES

TABLE = "web.pages"
STREAM = StreamConfig(name="pages", table=TABLE, unknown_fields="evolve",
                      columns=(Column("user_id", "string"),))
LIMITS = EvolveLimits(max_columns=40, max_name_length=16, max_depth=3)
_AS_IS = {"long", "double", "string", "boolean"}

RUNS: list[tuple[str, list[dict[str, Any] | None]]] = [
    ("new fields of every kind, none in the table yet", [
        {"n": 5, "price": 2.5, "ok": True, "plan": "pro", "geo": {"city": "Oslo", "zip": 1},
         "tags": ["a"], "when": "2026-11-23T10:00:00Z", "blank": None},
        {"n": 6, "price": 3, "geo": {"city": "Rome"}},
        None,
        {"n": 7, "big": 2**70},                   # beyond the long range: refused
        {"ok": None, "Plan": "free"},              # a case twin of a new field
    ]),
    ("only the table's flat columns: no new field", [
        {"n": 8, "price": 1, "ok": False, "plan": "free", "when": "x"},
        {"n": None, "price": None},
        {},
        None,
    ]),
    ("the table's flat and nested columns beside new fields", [
        {"n": 9, "geo": {"city": "Bonn", "zip": 2}, "tags": [], "fresh": 1.5},
        {"n": 10, "geo": {"street": "x"}, "fresh": 2},        # a member the struct lacks
        {"_event_id": None, "n": 12},                         # reserved name, null value
        {"a_very_long_field_name": 1},                        # past the name limit
        {"deep": [[[[1]]]]},                                  # past the depth limit
        {"N": 13},                                            # a case twin of a column
        {"blank": "now"},                                     # a null-only field gets a type
        {"tags": ["b", "c"], "big": 2**70},
    ]),
    ("a misfit in a flat column: the columnar read refuses the run", [
        {"n": "five", "price": 1.0},
        {"n": 1.5},
        {"ok": 1, "plan": 2},
        {"n": 14, "price": 4, "fresh": 3, "geo": {"city": 5}},
        {"price": 1e308, "n": 2**63},                         # beyond a long column
    ]),
    ("new fields whose shape varies between rows: the columnar read refuses the run", [
        {"n": 15, "shifty": 1, "shape": {"a": 1}, "misc": [1, "x"]},
        {"n": 16, "shifty": "one", "shape": [1], "misc": {"k": 1}},
        {"n": 17, "qty": 2**40},
        {"n": 18, "qty": "x"},
    ]),
]
"""Runs in order against one table; each names the path it takes through the decode."""


@pytest.fixture
def catalog(tmp_path: Any) -> SqlCatalog:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}",
                         warehouse=(tmp_path / "warehouse").as_uri())
    catalog.create_namespace("web")
    catalog.create_table(TABLE, Schema(
        NestedField(1, "user_id", StringType(), required=False),
        NestedField(2, "qty", IntegerType(), required=False),  # left by an older config
        NestedField(3, "_event_id", StringType(), required=False),
        NestedField(4, "_sequence", LongType(), required=False),
        NestedField(5, "_received_at", TimestamptzType(), required=False)))
    return catalog


def run_rows(extras: list[dict[str, Any] | None], first: int) -> pa.Table:
    texts = [None if e is None else msgspec.json.encode(e).decode() for e in extras]
    count = len(extras)
    return pa.table({
        "user_id": [f"u{first + i}" for i in range(count)],
        "_event_id": [f"e{first + i}" for i in range(count)],
        "_sequence": pa.array([first + i for i in range(count)], pa.int64()),
        "_received_at": pa.array([1_700_000_000_000_000] * count, pa.timestamp("us", "UTC")),
        EXTRA_FIELD: pa.array(texts, pa.string()),
    })


def reference(catalog: SqlCatalog, rows: pa.Table) -> tuple[dict[str, list], dict[str, str]]:
    """What the rules say, every field of every row decoded: each evolved column's values
    of the kept rows, and each refused event's reason."""
    declared = {c.name for c in STREAM.columns} | RESERVED
    columns, fixed = table_columns(catalog.load_table(TABLE).schema().fields, declared)
    extras = parse_extras(rows.column(EXTRA_FIELD).to_pylist())
    plan = plan_run(extras, columns, fixed, LIMITS, table=TABLE)
    ids = rows.column("_event_id").to_pylist()
    kept = [extra or {} for i, extra in enumerate(extras) if i not in plan.refused]
    values = {}
    for name, kind in plan.columns.items():
        column = [extra.get(name) for extra in kept]
        if kind not in _AS_IS:
            column = [column_value(value, parse_type(kind)) for value in column]
        values[name] = pa.array(column, ARROW_TYPES[kind]).to_pylist()
    return values, {ids[i]: reason for i, reason in plan.refused.items()}


def test_every_path_gives_what_the_rules_give_on_fully_decoded_rows(catalog):
    refusing = []
    for first, (_, extras) in enumerate(RUNS):
        rows = run_rows(extras, first * 100)
        want_values, want_refused = reference(catalog, rows)
        out, dead = evolve_rows(catalog, TABLE, STREAM, rows, {}, LIMITS)
        got_refused = {} if dead is None else dict(zip(
            dead.column("event_id").to_pylist(), dead.column("message").to_pylist(),
            strict=True))
        assert got_refused == want_refused
        assert {n: out.column(n).to_pylist() for n in want_values} == want_values
        assert out.num_rows == len(extras) - len(want_refused)
        refusing.append(bool(want_refused))
    assert refusing == [True, False, True, True, True]  # the runs test what they claim
    table = catalog.load_table(TABLE).schema()
    assert str(table.find_field("qty").field_type) == "long"  # widened, not refused


def test_parse_extras_can_keep_only_some_members():
    texts = ['{"a": 1, "b": null, "c": [1, {"d": 2}]}', None, '{}',
             '{"b": 99999999999999999999999, "e": "x"}', '{"weird name": true}']
    assert parse_extras(texts, only=["b", "c", "weird name"]) == [
        {"b": None, "c": [1, {"d": 2}]}, None, {}, {"b": 99999999999999999999999},
        {"weird name": True}]
    assert parse_extras(texts, only=[]) == [{}, None, {}, {}, {}]
    assert parse_extras(texts) == [
        {"a": 1, "b": None, "c": [1, {"d": 2}]}, None, {},
        {"b": 99999999999999999999999, "e": "x"}, {"weird name": True}]
