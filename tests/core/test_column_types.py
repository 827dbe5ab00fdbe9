"""Column type strings in icefloe.toml: the grammar's accepted shapes, and every refusal
naming the key, the column and what is wrong."""

from __future__ import annotations

import pytest
from config_support import HEADER, load_text

from icefloe.errors import ConfigError
from icefloe.streams.typespec import MAX_TYPE_DEPTH, parse_type

CONFIG = HEADER + """
[[streams]]
name = "orders"
table = "shop.orders"
columns = [
  {{ name = "id", type = "string" }},
  {{ name = "x", type = "{kind}" {extra}}},
]
"""


def load(tmp_path, kind: str, extra: str = ""):
    return load_text(tmp_path, CONFIG.format(kind=kind, extra=extra))


@pytest.mark.parametrize(("text", "canonical"), [
    ("decimal(10, 2)", "decimal(10,2)"),
    ("uuid", "uuid"), ("binary", "binary"), ("time", "time"),
    ("list<long>", "list<long>"),
    ("map<string, list<decimal(5,1)>>", "map<string,list<decimal(5,1)>>"),
    ("struct<a: int, b: struct<c: list<map<string,uuid>>>>",
     "struct<a: int, b: struct<c: list<map<string,uuid>>>>"),
    ("LIST<STRING>", "list<string>"),
])
def test_native_and_nested_types_load(tmp_path, text, canonical):
    config = load(tmp_path, text)
    assert config.streams[0].columns[1].type == text
    assert str(parse_type(text)) == canonical


DEEP = "list<" * (MAX_TYPE_DEPTH + 1) + "long" + ">" * (MAX_TYPE_DEPTH + 1)


@pytest.mark.parametrize(("text", "message"), [
    ("lnog", "unknown type 'lnog'"),
    ("list<long", "expected '>' after list<long, found 'the end'"),
    ("list<lnog>", "unknown type 'lnog'"),
    ("map<long, string>", "map keys must be string"),
    ("decimal(40, 2)", "decimal precision 40 must be 1..38"),
    ("decimal(5, 6)", "decimal scale 6 is larger than its precision 5"),
    ("decimal", "expected '(' after decimal"),
    ("struct<a: int, a: long>", "duplicate struct field 'a'"),
    ("struct<>", "expected a struct field name"),
    ("list<long> x", "unexpected 'x' after the type 'list<long>'"),
    ("timestamp_ns", "timestamp_ns is not supported: Iceberg stores nanosecond"),
    (DEEP, f"nested deeper than {MAX_TYPE_DEPTH} levels"),
])
def test_a_malformed_or_unknown_type_is_refused_naming_key_and_column(tmp_path, text,
                                                                       message):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert "streams[0].columns[1].type: " in str(info.value)
    assert message in str(info.value)
    assert "column 'x'" in str(info.value)


def test_a_native_type_on_a_mapped_column_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"streams\[0\]\.columns\[1\]\.type: type "
                       r"'decimal\(5,2\)' \(column 'x'\) applies to plain columns only, "
                       "not to a path mapping"):
        load(tmp_path, "decimal(5,2)", ', path = "$.a.b" ')
