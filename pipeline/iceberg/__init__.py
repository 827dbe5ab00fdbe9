"""Everything that writes Iceberg, and the only place that touches pyiceberg internals.

``catalog`` (open one from config) · ``tables`` (create or evolve a stream's table, its
Iceberg schema) · ``commit`` (the exactly-once commit) with ``confirm`` (settling an unknown
outcome) · ``table_commit`` (one table's rows of a collector run, in one call) · ``fence``
(taking tables over) · ``data_files`` (writing Parquet data files and adding them) ·
``file_append`` (the embedded path's append) · ``upsert`` (copy-on-write) · ``replace`` ·
``evolution`` · ``maintenance``. It imports neither pyspark nor :mod:`pipeline.load`; the
Arrow side of the schema it shares with them is :mod:`pipeline.columns` (re-exported here).

The face: what :mod:`collector` uses is listed in ``__all__`` and imported from here; each
name is loaded on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.faces import lazy_face
from pipeline.iceberg.pyiceberg_fixes import install_when_imported as _install_fixes

_install_fixes()  # null lists of structs survive pyiceberg's writes and scans (installed
# when pyiceberg's Arrow module loads: importing it here would cost every reader pandas)

if TYPE_CHECKING:
    from pipeline.columns import ARROW_TYPES, DEAD_LETTER_TABLE, dead_letter_arrow_schema
    from pipeline.iceberg.catalog import open_catalog
    from pipeline.iceberg.commit import (
        NO_SEQUENCE,
        REPLAY_PROP,
        SEQUENCE_PROP,
        SEQUENCES_PROP,
        SHARD_BITS,
        SOURCES_PROP,
        CommitResult,
        SourceRun,
        carried_version,
        commit_rows,
        committed_at_ms,
        committed_state,
        covers,
        decode_sequences,
        decode_sources,
        encode_sources,
        history_cut,
        not_committed,
        position,
        replay_marker,
        summary_props,
    )
    from pipeline.iceberg.data_files import AddFiles, FileSet, ReplaceFiles
    from pipeline.iceberg.errors import iceberg_errors, load_table_or_none
    from pipeline.iceberg.evolution import AddColumn, PromoteColumn, apply_changes, describe, shape
    from pipeline.iceberg.fence import fence_all, fence_table
    from pipeline.iceberg.field_numbers import rows_under_current_names
    from pipeline.iceberg.file_append import WriteThenAdd
    from pipeline.iceberg.maintenance import MaintenanceSettings, run_maintenance
    from pipeline.iceberg.replace import replace_rows
    from pipeline.iceberg.table_commit import commit_table
    from pipeline.iceberg.tables import ensure_dead_letter_table, ensure_stream_table, iceberg_type
    from pipeline.iceberg.upsert import missing_key_dead_letters, split_missing_keys

_HOME = {
    "ARROW_TYPES": "pipeline.columns",
    "AddColumn": "pipeline.iceberg.evolution",
    "AddFiles": "pipeline.iceberg.data_files",
    "CommitResult": "pipeline.iceberg.commit",
    "DEAD_LETTER_TABLE": "pipeline.columns",
    "FileSet": "pipeline.iceberg.data_files",
    "MaintenanceSettings": "pipeline.iceberg.maintenance",
    "NO_SEQUENCE": "pipeline.iceberg.commit",
    "PromoteColumn": "pipeline.iceberg.evolution",
    "ReplaceFiles": "pipeline.iceberg.data_files",
    "SEQUENCES_PROP": "pipeline.iceberg.commit",
    "SEQUENCE_PROP": "pipeline.iceberg.commit",
    "SHARD_BITS": "pipeline.iceberg.commit",
    "SOURCES_PROP": "pipeline.iceberg.commit",
    "SourceRun": "pipeline.iceberg.commit",
    "WriteThenAdd": "pipeline.iceberg.file_append",
    "apply_changes": "pipeline.iceberg.evolution",
    "REPLAY_PROP": "pipeline.iceberg.commit",
    "replay_marker": "pipeline.iceberg.commit",
    "carried_version": "pipeline.iceberg.commit",
    "commit_rows": "pipeline.iceberg.commit",
    "covers": "pipeline.iceberg.commit",
    "summary_props": "pipeline.iceberg.commit",
    "commit_table": "pipeline.iceberg.table_commit",
    "committed_at_ms": "pipeline.iceberg.commit",
    "committed_state": "pipeline.iceberg.commit",
    "dead_letter_arrow_schema": "pipeline.columns",
    "decode_sequences": "pipeline.iceberg.commit",
    "decode_sources": "pipeline.iceberg.commit",
    "describe": "pipeline.iceberg.evolution",
    "encode_sources": "pipeline.iceberg.commit",
    "ensure_dead_letter_table": "pipeline.iceberg.tables",
    "ensure_stream_table": "pipeline.iceberg.tables",
    "fence_all": "pipeline.iceberg.fence",
    "fence_table": "pipeline.iceberg.fence",
    "history_cut": "pipeline.iceberg.commit",
    "iceberg_errors": "pipeline.iceberg.errors",
    "iceberg_type": "pipeline.iceberg.tables",
    "load_table_or_none": "pipeline.iceberg.errors",
    "missing_key_dead_letters": "pipeline.iceberg.upsert",
    "not_committed": "pipeline.iceberg.commit",
    "open_catalog": "pipeline.iceberg.catalog",
    "position": "pipeline.iceberg.commit",
    "replace_rows": "pipeline.iceberg.replace",
    "rows_under_current_names": "pipeline.iceberg.field_numbers",
    "run_maintenance": "pipeline.iceberg.maintenance",
    "shape": "pipeline.iceberg.evolution",
    "split_missing_keys": "pipeline.iceberg.upsert",
}
"""Where each public name lives: imported on first use (PEP 562), so importing one module of
the package — or the face itself — loads nothing it does not need."""

__all__ = [
    "ARROW_TYPES",
    "DEAD_LETTER_TABLE",
    "NO_SEQUENCE",
    "REPLAY_PROP",
    "SEQUENCES_PROP",
    "SEQUENCE_PROP",
    "SHARD_BITS",
    "SOURCES_PROP",
    "AddColumn",
    "AddFiles",
    "CommitResult",
    "FileSet",
    "MaintenanceSettings",
    "PromoteColumn",
    "ReplaceFiles",
    "SourceRun",
    "WriteThenAdd",
    "apply_changes",
    "carried_version",
    "commit_rows",
    "commit_table",
    "committed_at_ms",
    "committed_state",
    "covers",
    "dead_letter_arrow_schema",
    "decode_sequences",
    "decode_sources",
    "describe",
    "encode_sources",
    "ensure_dead_letter_table",
    "ensure_stream_table",
    "fence_all",
    "fence_table",
    "history_cut",
    "iceberg_errors",
    "iceberg_type",
    "load_table_or_none",
    "missing_key_dead_letters",
    "not_committed",
    "open_catalog",
    "position",
    "replace_rows",
    "replay_marker",
    "rows_under_current_names",
    "run_maintenance",
    "shape",
    "split_missing_keys",
    "summary_props",
]


__getattr__, __dir__ = lazy_face(__name__, _HOME, __all__)
