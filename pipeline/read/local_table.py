"""A table of a local SQLite catalog, read from its metadata file and Avro manifests alone.

Why: importing pyiceberg's table layer builds ~185 pydantic models, the largest part of a
cold ``icefloe query`` (issue #28's one-second target). For the plain case — format
version 2, local files, top-level columns of the types DuckDB reads itself, no delete
files — what the query needs is small: the snapshots (to pin one: current, by id, by
version, by time), the pinned snapshot's schema and its live data files. This module reads
exactly that with ``json`` and :mod:`pipeline.read.avro_files`, and answers the questions
the pinning code asks a pyiceberg ``Table`` (``snapshots()``, ``snapshot_by_id``,
``current_snapshot()``, ``snapshot_as_of_timestamp``) the way pyiceberg answers them.

Anything else raises :class:`Unusual`, at load or when planning a snapshot's files, and
the caller reads the table through pyiceberg, from the same metadata file
(:func:`pipeline.read.tables.as_pyiceberg`): an answer from this module is either pyiceberg's
answer or none. ``tests/pipeline/test_query_cold_start.py`` compares the two.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.read.avro_files import (
    AvroFile,
    AvroUnsupported,
    field_names_by_id,
    record_schema_of,
)
from pipeline.read.paths import local_path

if TYPE_CHECKING:
    from icefloe.config import CatalogSection

DUCKDB_TYPES = {"boolean": "BOOLEAN", "int": "INTEGER", "long": "BIGINT", "float": "FLOAT",
                "double": "DOUBLE", "date": "DATE", "timestamp": "TIMESTAMP",
                "timestamptz": "TIMESTAMPTZ", "string": "VARCHAR", "binary": "BLOB"}
"""Iceberg types DuckDB reads from Parquet as pyarrow hands them to it (plus ``decimal``)."""
DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")

# Iceberg's field ids in manifest lists and manifests (the spec's, fixed for all writers).
_MANIFEST_PATH, _MANIFEST_CONTENT = 500, 517
_STATUS, _DATA_FILE = 0, 2
_CONTENT, _FILE_PATH, _FILE_FORMAT, _RECORD_COUNT, _FILE_SIZE = 134, 100, 101, 103, 104
_DELETED = 2  # manifest entry status


class Unusual(Exception):
    """Something this reader does not handle exactly; read the table through pyiceberg."""


@dataclass(frozen=True)
class Summary:
    """A snapshot's summary as pyiceberg names it: the operation and the other entries
    (what :mod:`pipeline.read.versions` reads to tell a commit's end from its middle)."""

    operation: str
    additional_properties: dict[str, str]


@dataclass(frozen=True)
class Snapshot:
    """The fields of a snapshot the pinning code reads, named as pyiceberg names them."""

    snapshot_id: int
    sequence_number: int
    timestamp_ms: int
    manifest_list: str
    schema_id: int | None
    parent_snapshot_id: int | None = None
    summary: Summary | None = None


@dataclass(frozen=True)
class LogEntry:
    """One ``snapshot-log`` entry: the snapshot current from ``timestamp_ms`` on."""

    snapshot_id: int
    timestamp_ms: int


@dataclass(frozen=True)
class Field:
    """A top-level column; ``field_type`` is the type as pyiceberg prints it."""

    field_id: int
    name: str
    field_type: str
    initial_default: None = None


@dataclass(frozen=True)
class Schema:
    schema_id: int
    fields: tuple[Field, ...]


@dataclass(frozen=True)
class DataFile:
    file_path: str
    file_format: str  # upper case, as pyiceberg's FileFormat compares
    file_size_in_bytes: int
    record_count: int
    content: int = 0


@dataclass(frozen=True)
class Task:
    """A data file to read whole (no delete files: a snapshot with any is :class:`Unusual`)."""

    file: DataFile
    delete_files: tuple[()] = ()


class LocalTable:
    """A local format-version-2 table as of one metadata file (see the module docstring)."""

    def __init__(self, catalog: CatalogSection, identifier: str, location: str,
                 metadata: dict[str, Any]) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self.metadata_location = location
        self._snapshots = [_snapshot(s) for s in metadata.get("snapshots") or []]
        self._log = [LogEntry(int(e["snapshot-id"]), int(e["timestamp-ms"]))
                     for e in metadata.get("snapshot-log") or []]
        self._schemas = [_schema(s) for s in metadata["schemas"]]
        self._current_schema_id = metadata["current-schema-id"]
        current = metadata.get("current-snapshot-id")
        self._current_snapshot_id = None if current is None or current == -1 else int(current)
        if not any(s.schema_id == self._current_schema_id for s in self._schemas):
            raise Unusual("the current schema is missing")

    @classmethod
    def read(cls, catalog: CatalogSection, identifier: str, location: str) -> LocalTable:
        """The table as of metadata file ``location``; :class:`Unusual` if not plain."""
        path = local_path(location)
        if path is None or not location.endswith(".metadata.json") or \
                location.endswith(".gz.metadata.json"):
            raise Unusual("metadata file not local, or compressed")
        if "py-io-impl" in catalog.properties:
            raise Unusual("a custom FileIO")
        try:
            with open(path, "rb") as handle:
                metadata = json.loads(handle.read())
        except (OSError, ValueError) as exc:
            raise Unusual(f"metadata unreadable here: {exc}") from None
        if not isinstance(metadata, dict) or metadata.get("format-version") != 2:
            raise Unusual("not a format-version 2 table")
        if "py-io-impl" in (metadata.get("properties") or {}):
            raise Unusual("a custom FileIO")
        try:
            return cls(catalog, identifier, location, metadata)
        except (KeyError, TypeError, ValueError) as exc:
            raise Unusual(f"metadata this reader does not know: {exc!r}") from None

    # -- what pin(), resolve_snapshot() and resolve_version() ask of a pyiceberg Table --

    def name(self) -> tuple[str, ...]:
        namespace, _, name = self.identifier.rpartition(".")
        return (*namespace.split("."), name)

    def snapshots(self) -> list[Snapshot]:
        return list(self._snapshots)

    def snapshot_by_id(self, snapshot_id: int) -> Snapshot | None:
        return next((s for s in self._snapshots if s.snapshot_id == snapshot_id), None)

    def current_snapshot(self) -> Snapshot | None:
        if self._current_snapshot_id is None:
            return None
        return self.snapshot_by_id(self._current_snapshot_id)

    def history(self) -> list[LogEntry]:
        return list(self._log)

    def snapshot_as_of_timestamp(self, timestamp_ms: int, inclusive: bool = True
                                 ) -> Snapshot | None:
        """The snapshot current at ``timestamp_ms``, by the snapshot log, as pyiceberg."""
        for entry in reversed(self._log):
            if (inclusive and entry.timestamp_ms <= timestamp_ms) or \
                    entry.timestamp_ms < timestamp_ms:
                return self.snapshot_by_id(entry.snapshot_id)
        return None

    # -- planning a pinned snapshot --

    def schema_at(self, snapshot_id: int | None) -> Schema:
        """The schema a scan of ``snapshot_id`` projects: the snapshot's own schema,
        the current one when the snapshot names none (pyiceberg's ``projection()``)."""
        wanted = self._current_schema_id
        if snapshot_id is not None:
            snapshot = self.snapshot_by_id(snapshot_id)
            if snapshot is None:
                raise Unusual(f"no snapshot {snapshot_id}")
            if snapshot.schema_id is not None:
                wanted = snapshot.schema_id
        schema = next((s for s in self._schemas if s.schema_id == wanted), None)
        if schema is None:
            raise Unusual(f"schema {wanted} is missing")
        return schema

    def plan_files(self, snapshot_id: int) -> tuple[Task, ...]:
        """The live data files of the snapshot, in pyiceberg's order (manifest list order,
        then entry order), skipping empty files as pyiceberg's scan does."""
        snapshot = self.snapshot_by_id(snapshot_id)
        if snapshot is None:
            raise Unusual(f"no snapshot {snapshot_id}")
        tasks: list[Task] = []
        try:
            for manifest in _manifests(snapshot.manifest_list):
                tasks.extend(_data_files(manifest))
        except (AvroUnsupported, KeyError, TypeError, ValueError, OSError) as exc:
            raise Unusual(f"manifests this reader does not read: {exc}") from None
        return tuple(tasks)


def _snapshot(raw: dict[str, Any]) -> Snapshot:
    schema_id = raw.get("schema-id")
    parent = raw.get("parent-snapshot-id")
    summary = raw.get("summary")
    if summary is not None:
        props = {str(k): str(v) for k, v in summary.items() if k != "operation"}
        summary = Summary(str(summary["operation"]), props)
    return Snapshot(int(raw["snapshot-id"]), int(raw.get("sequence-number") or 0),
                    int(raw["timestamp-ms"]), str(raw["manifest-list"]),
                    None if schema_id is None else int(schema_id),
                    None if parent is None else int(parent), summary)


def _schema(raw: dict[str, Any]) -> Schema:
    """A schema of top-level plain columns, else :class:`Unusual`."""
    fields = []
    for field in raw["fields"]:
        kind = field["type"]
        if not isinstance(kind, str):
            raise Unusual(f"column {field['name']!r} is nested")
        decimal = DECIMAL.fullmatch(kind)
        if decimal is not None:
            kind = f"decimal({int(decimal.group(1))}, {int(decimal.group(2))})"
        elif kind not in DUCKDB_TYPES:
            raise Unusual(f"column {field['name']!r} is of type {kind}")
        if field.get("initial-default") is not None:
            raise Unusual(f"column {field['name']!r} has an initial default")
        fields.append(Field(int(field["id"]), str(field["name"]), kind))
    return Schema(int(raw.get("schema-id", 0)), tuple(fields))


def _read_avro(location: str) -> AvroFile:
    path = local_path(location)
    if path is None:
        raise Unusual(f"{location}: not a local file")
    with open(path, "rb") as handle:
        return AvroFile(handle.read())


def _manifests(manifest_list: str) -> list[str]:
    """The data manifests of a manifest list; a delete manifest is :class:`Unusual`."""
    avro = _read_avro(manifest_list)
    names = field_names_by_id(avro.schema)
    path, content = names[_MANIFEST_PATH], names[_MANIFEST_CONTENT]
    out = []
    for record in avro.records():
        if record[content] != 0:
            raise Unusual("the snapshot has delete files")
        out.append(record[path])
    return out


def _data_files(manifest: str) -> list[Task]:
    """The live, non-empty data files of one manifest."""
    avro = _read_avro(manifest)
    entry = field_names_by_id(avro.schema)
    status, data_file = entry[_STATUS], entry[_DATA_FILE]
    file_schema = record_schema_of(next(f["type"] for f in avro.schema["fields"]
                                        if f["name"] == data_file))
    names = field_names_by_id(file_schema)
    content, file_path, file_format = names[_CONTENT], names[_FILE_PATH], names[_FILE_FORMAT]
    record_count, size = names[_RECORD_COUNT], names[_FILE_SIZE]
    tasks = []
    for record in avro.records():
        if record[status] == _DELETED:
            continue
        data = record[data_file]
        if data[content] != 0:
            raise Unusual("a delete file in a data manifest")
        if data[record_count] == 0:
            continue  # pyiceberg's metrics evaluator skips empty files
        tasks.append(Task(DataFile(data[file_path], str(data[file_format]).upper(),
                                   data[size], data[record_count])))
    return tasks
