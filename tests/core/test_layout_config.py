"""``partition_by``, ``sort_by`` and ``table_properties`` are parsed strictly when the
config is loaded: an unknown column, a transform that does not fit the column's type,
malformed text or a property icefloe owns is a ConfigError naming the entry."""

from __future__ import annotations

import textwrap

import pytest
from config_support import HEADER, load_text

from icefloe.errors import ConfigError
from icefloe.streams.layout import PartField, SortKey, parse_partition, parse_sort

BASE = HEADER + textwrap.dedent("""
    [[streams]]
    name = "pageviews"
    table = "web.pageviews"
    columns = [
      { name = "user_id", type = "string" },
      { name = "country", type = "string" },
      { name = "n", type = "long" },
      { name = "ok", type = "boolean" },
      { name = "day", type = "date" },
      { name = "ts", type = "timestamp" },
      { name = "price", type = "decimal(9,2)" },
      { name = "tags", type = "list<string>" },
    ]
""")


def load(tmp_path, extra: str):
    return load_text(tmp_path, BASE + textwrap.dedent(extra))


def test_a_full_layout_loads(tmp_path) -> None:
    config = load(tmp_path, """
        partition_by = ["day(_received_at)", "bucket(16, user_id)", "truncate(4, country)",
                        "month(day)", "truncate(100, price)", "n"]
        sort_by = ["user_id", "_received_at desc", "n asc nulls last"]
        [streams.table_properties]
        "write.target-file-size-bytes" = "1000000"
        "write.parquet.compression-codec" = "zstd"
    """)
    [stream] = config.streams
    assert stream.partition_by == ("day(_received_at)", "bucket(16, user_id)",
                                   "truncate(4, country)", "month(day)",
                                   "truncate(100, price)", "n")
    assert stream.table_properties["write.parquet.compression-codec"] == "zstd"


def test_parsing() -> None:
    assert parse_partition(" bucket( 16 ,user_id ) ") == PartField("bucket", "user_id", 16)
    assert parse_partition("country") == PartField("identity", "country")
    assert parse_partition("identity(country)") == PartField("identity", "country")
    assert parse_sort("ts DESC") == SortKey("ts", True, False)
    assert parse_sort("ts desc nulls first") == SortKey("ts", True, True)
    assert parse_sort("ts") == SortKey("ts", False, True)


@pytest.mark.parametrize(("extra", "message"), [
    ('partition_by = ["day(nope)"]',
     r"streams\[0\]\.partition_by\[0\]: unknown column 'nope'"),
    ('partition_by = ["day(_received_at)", "bucket(16, ok)"]',
     r"partition_by\[1\]: bucket does not apply to column 'ok' of type boolean"),
    ('partition_by = ["hour(day)"]', r"hour does not apply to column 'day' of type date"),
    ('partition_by = ["truncate(4, ts)"]', r"truncate does not apply to column 'ts'"),
    ('partition_by = ["tags"]', r"identity does not apply to column 'tags' of type list"),
    ('partition_by = ["bucket(user_id)"]', r"bucket needs a number first"),
    ('partition_by = ["day(ts, 3)"]', r"partition_by\[0\]: cannot parse 'day\(ts, 3\)'"),
    ('partition_by = ["day(ts"]', r"cannot parse"),
    ('partition_by = ["weekly(ts)"]', r"unknown transform 'weekly'"),
    ('partition_by = ["bucket(0, n)"]', r"bucket's number must be 1 to 1000000"),
    ('partition_by = ["day(ts)", "hour(ts)"]', r"column 'ts' is partitioned twice"),
    ('partition = "hour"\npartition_by = ["day(ts)"]',
     r"partition_by: set either partition_by or .*\.partition"),
    ('sort_by = ["nope"]', r"sort_by\[0\]: unknown column 'nope'"),
    ('sort_by = ["n sideways"]', r"sort_by\[0\]: cannot parse"),
    ('sort_by = ["tags"]', r"sort_by\[0\]: column 'tags' is list"),
    ('table_properties = { "format-version" = "1" }',
     r"table_properties: 'format-version' is set by icefloe itself"),
    ('table_properties = { "icefloe.managed" = "false" }',
     r"'icefloe.managed' is set by icefloe itself"),
    ('table_properties = { "commit.retry.num-retries" = "4" }', r"set by icefloe itself"),
    ('table_properties = { "write.parquet.compression-codec" = "lzma" }',
     r"must be one of zstd"),
    ('table_properties = { "write.target-file-size-bytes" = "big" }',
     r"positive whole number of bytes"),
])
def test_bad_layouts_are_refused_naming_the_entry(tmp_path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, extra)
