"""Evolved columns take the table's Arrow types (:func:`pipeline.load.extras.column_of`)."""

from __future__ import annotations

from icefloe.streams.evolution import parse_extras
from pipeline.load.extras import column_of


def test_evolved_columns_take_the_table_types() -> None:
    extras = parse_extras(['{"n":1,"geo":{"a":2}}', None, '{"n":2.5}'])
    assert column_of(extras, "n", "double").to_pylist() == [1.0, None, 2.5]
    assert column_of(extras, "geo", "json").to_pylist() == ['{"a":2}', None, None]
