"""The SQL dialects icefloe reads (queries, models, mappings), without importing sqlglot.

Why apart from :mod:`icefloe.streams.divergent`: the CLI lists them in ``--help`` and checks
``--dialect`` before anything heavy is imported.
"""

from __future__ import annotations

from collections.abc import Mapping

DIALECTS = ("spark", "duckdb", "postgres")
"""The dialects icefloe reads SQL in (queries, models, mappings)."""

ICEBERG_TO_SQL = {"int": "INT", "long": "BIGINT", "float": "FLOAT", "double": "DOUBLE",
                  "string": "TEXT", "uuid": "TEXT", "boolean": "BOOLEAN", "date": "DATE",
                  "timestamp": "TIMESTAMP", "timestamptz": "TIMESTAMPTZ", "binary": "BINARY"}
"""Iceberg type -> the SQL type sqlglot infers with (``uuid`` reads as text, see
``pipeline.read.query``); ``decimal(p, s)`` maps to itself."""


def check_dialect(name: str) -> str:
    """``name`` lower-cased when icefloe reads SQL in it, else a ValueError listing them."""
    lowered = name.strip().lower()
    if lowered not in DIALECTS:
        raise ValueError(f"unknown SQL dialect {name!r}: choose one of {', '.join(DIALECTS)}")
    return lowered


def sql_types(columns: Mapping[str, str]) -> dict[str, str]:
    """Iceberg column types as SQL types sqlglot can infer with (unknown ones left out)."""
    out = {}
    for name, kind in columns.items():
        if kind.startswith("decimal"):
            out[name] = kind.upper()
        elif kind in ICEBERG_TO_SQL:
            out[name] = ICEBERG_TO_SQL[kind]
    return out
