"""A stream table's layout: its partition fields, its sort order and the table properties
passed through to Iceberg.

Why in the core and parsed here, strictly: the same text comes from ``icefloe.toml``
(``streams[].partition_by``, ``sort_by``, ``table_properties``) and from the admin API, and
a mistake (a column that does not exist, ``bucket`` on a boolean, ``truncate`` on a
timestamp, a stray comma) must be refused where it is written, naming the entry, not
surface as a pyiceberg error on the collector's next start. The Iceberg objects are built
from these plain values by :mod:`pipeline.iceberg.tables`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from icefloe.errors import ConfigError
from icefloe.streams.model import StreamConfig
from icefloe.streams.typespec import BadType, parse_type

T = TypeVar("T")

ENVELOPE_TYPES: dict[str, str] = {"_event_id": "string", "_received_at": "timestamp",
                                  "_sequence": "long", "_shard": "int"}
"""The columns icefloe adds to every stream table, in the config's type vocabulary."""

TIME_TRANSFORMS = ("year", "month", "day", "hour")
_FITS: dict[str, frozenset[str]] = {
    "identity": frozenset({"string", "long", "int", "float", "double", "boolean", "timestamp",
                           "date", "json", "uuid", "binary", "time", "decimal",
                           "timestamp_ntz"}),
    "year": frozenset({"timestamp", "date"}),
    "month": frozenset({"timestamp", "date"}),
    "day": frozenset({"timestamp", "date"}),
    "hour": frozenset({"timestamp"}),
    "bucket": frozenset({"string", "long", "int", "timestamp", "date", "json", "uuid",
                         "binary", "time", "decimal"}),
    "truncate": frozenset({"string", "long", "int", "json", "binary", "decimal"}),
}
"""The column types each transform takes (Iceberg's rules; ``json`` is stored as string)."""
SORTABLE = _FITS["identity"]

OWNED_PROPERTIES = ("format-version", "commit.retry.num-retries")
"""Table properties icefloe sets itself; ``icefloe.*`` keys are icefloe's too (but for
:data:`UUID_BOUNDS_PROP`, which a stream may set)."""
UUID_BOUNDS_PROP = "icefloe.uuid-bounds"
"""``omit`` (default) or ``write``: whether the data files icefloe writes carry min/max
bounds for the table's ``uuid`` columns. Why omit: the Iceberg spec orders uuids as unsigned
bytes (icefloe writes them so), Java Iceberg up to 1.10 compares them signed, so Spark or
Trino with Iceberg's runtime skip a file holding ``WHERE uid = '...'`` and answer nothing.
Without bounds every reader reads the file (``pipeline.iceberg.tables``)."""
UUID_BOUNDS = ("omit", "write")
CODECS = ("zstd", "snappy", "gzip", "lz4", "brotli", "uncompressed")

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_FIELD = re.compile(rf"\s*(?:(?P<fn>[a-z]+)\s*\(\s*(?:(?P<n>\d+)\s*,\s*)?(?P<col>{_NAME})\s*\)"
                    rf"|(?P<bare>{_NAME}))\s*")
_SORT = re.compile(rf"\s*(?P<col>{_NAME})(?:\s+(?P<dir>asc|desc))?"
                   r"(?:\s+nulls\s+(?P<nulls>first|last))?\s*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class PartField:
    """One partition field: ``transform`` of ``column`` (``param``: bucket count N or
    truncate width W)."""

    transform: str
    column: str
    param: int | None = None

    @property
    def text(self) -> str:
        if self.param is not None:
            return f"{self.transform}({self.param}, {self.column})"
        return f"{self.transform}({self.column})"


@dataclass(frozen=True, slots=True)
class SortKey:
    """One sort field: ``column`` ascending unless ``descending``; nulls first or last
    (Iceberg's default: first when ascending, last when descending)."""

    column: str
    descending: bool = False
    nulls_first: bool = True


def parse_partition(text: str) -> PartField:
    """``day(_received_at)``, ``bucket(16, user_id)``, ``truncate(4, country)``,
    ``identity(country)`` or a bare ``country``; raises ``ValueError`` saying what is wrong."""
    match = _FIELD.fullmatch(text)
    if match is None:
        raise ValueError(f"cannot parse {text!r}: expected transform(column), bucket(N, column), "
                         "truncate(W, column) or a column name")
    if match["bare"]:
        return PartField("identity", match["bare"])
    fn, column, n = match["fn"], match["col"], match["n"]
    if fn not in _FITS:
        raise ValueError(f"unknown transform {fn!r} in {text!r} (expected one of "
                         f"{', '.join(_FITS)})")
    needs = fn in ("bucket", "truncate")
    if needs and n is None:
        raise ValueError(f"{fn} needs a number first: {fn}(N, {column})")
    if not needs and n is not None:
        raise ValueError(f"{fn} takes only a column: {fn}({column})")
    if needs and not 0 < int(n) <= 1_000_000:
        raise ValueError(f"{fn}'s number must be 1 to 1000000, not {n}")
    return PartField(fn, column, int(n) if needs else None)


def parse_sort(text: str) -> SortKey:
    """``user_id``, ``ts desc``, ``ts asc nulls last``; raises ``ValueError``."""
    match = _SORT.fullmatch(text)
    if match is None:
        raise ValueError(f"cannot parse {text!r}: expected 'column', 'column asc|desc', "
                         "optionally followed by 'nulls first|last'")
    descending = (match["dir"] or "asc").lower() == "desc"
    nulls = match["nulls"]
    first = (nulls.lower() == "first") if nulls else not descending
    return SortKey(match["col"], descending, first)


def partition_fields(stream: StreamConfig) -> list[PartField]:
    """The stream's partition fields: ``partition_by`` when given, else the older
    ``partition`` key (a time transform of ``_received_at``, or none)."""
    if stream.partition_by is not None:
        return [parse_partition(text) for text in stream.partition_by]
    if stream.partition == "none":
        return []
    return [PartField(stream.partition, "_received_at")]


def sort_keys(stream: StreamConfig) -> list[SortKey]:
    return [parse_sort(text) for text in stream.sort_by]


def column_types(stream: StreamConfig) -> dict[str, str]:
    """Every column of the stream's table by its type's family name (``decimal(10,2)`` →
    ``decimal``, ``list<long>`` → ``list``), envelope columns included."""
    kinds = dict(ENVELOPE_TYPES)
    for column in stream.columns:
        try:
            kinds[column.name] = parse_type(column.type).name
        except BadType:
            kinds[column.name] = column.type  # refused by the column checks already
    return kinds


def check_layout(stream: StreamConfig, at: str) -> None:
    """``partition_by``, ``sort_by`` and ``table_properties`` of one stream or sink; every
    message names the entry (``at.partition_by[1]: ...``)."""
    if stream.partition_by is not None and stream.partition != "day":
        # (partition = "day", the default, is refused with partition_by where the file
        # still shows whether it was written: check_raw_partition)
        raise ConfigError(both_partitions(at, stream.partition))
    kinds = column_types(stream)
    seen: set[str] = set()
    for i, text in enumerate(stream.partition_by or ()):
        field = _parsed(parse_partition, text, f"{at}.partition_by[{i}]")
        _check_fit(field, kinds, f"{at}.partition_by[{i}]")
        if field.column in seen:
            raise ConfigError(f"{at}.partition_by[{i}]: column {field.column!r} is "
                              "partitioned twice; pyiceberg's writer takes one transform per "
                              "column")
        seen.add(field.column)
    sorted_on: set[str] = set()
    for i, text in enumerate(stream.sort_by):
        key = _parsed(parse_sort, text, f"{at}.sort_by[{i}]")
        kind = kinds.get(key.column)
        if kind is None:
            raise ConfigError(f"{at}.sort_by[{i}]: unknown column {key.column!r} (not a "
                              "declared or envelope column)")
        if kind not in SORTABLE:
            raise ConfigError(f"{at}.sort_by[{i}]: column {key.column!r} is {kind}; only "
                              "flat columns sort")
        if key.column in sorted_on:
            raise ConfigError(f"{at}.sort_by[{i}]: column {key.column!r} is listed twice")
        sorted_on.add(key.column)
    check_properties(stream.table_properties, f"{at}.table_properties")


def both_partitions(at: str, partition: object) -> str:
    """The refusal of ``partition`` and ``partition_by`` given together (``at``: the
    stream's key path, maybe led by the file), with the ``partition_by`` that says what
    ``partition`` did."""
    key = at.rsplit(": ", 1)[-1]  # the key path alone, when naming the second key
    text = (f"{at}.partition_by: set either partition_by or {key}.partition "
            f"(= {partition!r}), not both")
    if partition == "none":
        return text + "; partition_by = [] says the same (unpartitioned)"
    if partition in TIME_TRANSFORMS:
        return text + f"; partition_by = [\"{partition}(_received_at)\"] says the same"
    return text


def check_raw_partition(raw: Mapping[str, Any], at: str) -> None:
    """A stream as written (before decoding): ``partition`` and ``partition_by`` both set
    is refused whatever ``partition`` says (once decoded, ``partition = "day"`` cannot be
    told from the default)."""
    if "partition" in raw and raw.get("partition_by") is not None:
        raise ConfigError(both_partitions(at, raw["partition"]))


def _parsed(parse: Callable[[str], T], text: str, at: str) -> T:
    try:
        return parse(text)
    except ValueError as exc:
        raise ConfigError(f"{at}: {exc}") from None


def _check_fit(field: PartField, kinds: dict[str, str], at: str) -> None:
    kind = kinds.get(field.column)
    if kind is None:
        raise ConfigError(f"{at}: unknown column {field.column!r} in {field.text!r} (not a "
                          "declared or envelope column)")
    if kind not in _FITS[field.transform]:
        fits = ", ".join(sorted(_FITS[field.transform]))
        raise ConfigError(f"{at}: {field.transform} does not apply to column {field.column!r} "
                          f"of type {kind} (it takes {fits})")


def check_properties(properties: dict[str, str], at: str) -> None:
    """Refuse the keys icefloe owns, and values the writer would choke on later."""
    for key, value in properties.items():
        if key == UUID_BOUNDS_PROP:
            if value not in UUID_BOUNDS:
                raise ConfigError(f"{at}: {key!r} must be one of {', '.join(UUID_BOUNDS)}, "
                                  f"not {value!r}")
            continue
        if key in OWNED_PROPERTIES or key.startswith("icefloe."):
            raise ConfigError(f"{at}: {key!r} is set by icefloe itself and cannot be "
                              "configured")
        if key == "write.target-file-size-bytes" and not (value.isdigit() and int(value) > 0):
            raise ConfigError(f"{at}: {key!r} must be a positive whole number of bytes, "
                              f"not {value!r}")
        if key == "write.parquet.compression-codec" and value not in CODECS:
            raise ConfigError(f"{at}: {key!r} must be one of {', '.join(CODECS)}, not "
                              f"{value!r}")
