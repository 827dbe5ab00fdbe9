"""Table maintenance: compaction, snapshot expiry and file deletion for icefloe's tables.

Why we build it: a table committed every second gains one data file per partition, one
manifest, one manifest list and one metadata.json per commit. Left alone, scans slow down
(planning opens every manifest, reading opens every tiny file), metadata.json grows by
~0.8 KB per snapshot and is rewritten on every commit, and storage grows without bound.
pyiceberg 0.12 offers snapshot expiry (metadata only) but neither compaction nor file
cleanup, so this module supplies them.

The collector calls :func:`run_maintenance` between its own commits, never concurrently with
them. Every rule below still keeps the exactly-once protocol (``pipeline/iceberg/commit.py``) intact
if that assumption is broken:

* compaction is an ordinary icefloe commit: it checks the epoch, carries ``icefloe.sequence``
  and ``icefloe.epoch`` forward, and fails instead of rebasing when anyone committed after
  the table object was loaded (``CommitFailedException``, as for appends);
* expiry never drops the current snapshot, branch/tag heads, the newest snapshot carrying
  ``icefloe.sequence``, nor any snapshot on the parent chain between the two (expiring one
  would cut the walk :func:`~pipeline.iceberg.commit.committed_state` does and lose the offset);
* deletion never removes anything the current metadata references, and removes a file that
  was never referenced (a possible in-flight write) only once it is older than a safety age.

Ages are judged by the store's clock (``clock``: the collector passes its
:class:`~icefloe.clock.StoreClock`): a snapshot's age by the ``icefloe.committed-at`` its
commit recorded (``timestamp-ms``, the committing host's clock, only for snapshots without
it), a file's by its modification time in the store. A host whose clock runs hours ahead
thus never expires young snapshots nor deletes the files of a commit in flight.
"""

from __future__ import annotations

import itertools
import logging
import re
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlparse

import msgspec
import pyarrow.fs as pafs
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    ArrowScan,
    PyArrowFileIO,
    _check_pyarrow_schema_compatible,
)
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import FileScanTask, Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record

from icefloe.clock import SYSTEM, Clock
from pipeline.iceberg.commit import (
    CommittedState,
    carried_props,
    check_epoch,
    committed_at_ms,
    committed_state,
    summary_props,
)
from pipeline.iceberg.confirm import confirm_in_place
from pipeline.iceberg.data_files import TableFiles, TableTarget, data_file_entry, delete_files
from pipeline.iceberg.reachable import normalize, referenced

MiB = 1024 * 1024

log = logging.getLogger("icefloe.maintenance")

_METADATA_JSON = re.compile(r"^(\d+)-[^/]*\.metadata\.json$")
# Files a catalog may rely on although no metadata.json names them (Hadoop tables).
_NEVER_DELETE = frozenset({"version-hint.text"})
_IO_THREADS = 8


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What one :func:`compact` call rewrote. ``snapshot_id`` is None when nothing was due."""

    files_removed: int = 0
    files_added: int = 0
    rows: int = 0
    bytes_removed: int = 0
    bytes_added: int = 0
    partitions: int = 0
    snapshot_id: int | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class DeletionResult:
    """What :func:`delete_unreachable_files` removed, and what it left alone on purpose.

    ``kept_young`` counts unreferenced files younger than the safety age (they may belong to
    a commit in flight); ``errors`` counts deletes that failed (retried on the next run).
    """

    deleted: int = 0
    bytes: int = 0
    kept_young: int = 0
    errors: int = 0
    reachable: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    """The outcome of one :func:`run_maintenance` pass over one table."""

    table: str
    compaction: CompactionResult
    expired_snapshots: int
    deletion: DeletionResult
    seconds: float


@dataclass(frozen=True, slots=True)
class MaintenanceSettings:
    """Knobs of :func:`run_maintenance`, with defaults for a table committed every second.

    * ``keep_last=100`` / ``max_snapshot_age_s=600``: a snapshot is expired only when it is
      both outside the newest 100 *and* older than 10 minutes. At one commit a second that
      keeps ~600 snapshots: ~0.5 MB of metadata.json rewritten per commit (an hour, 3600
      snapshots, would be ~3 MB per commit, every second) while still giving a reader or a
      time-travel query 10 minutes before files it may read can disappear.
    * ``target_file_bytes=128 MiB`` / ``min_input_files=8``: rewrite a partition once it has
      8 files smaller than 64 MiB; 8 keeps a lightly fed partition from being rewritten on
      every pass (write amplification) while bounding the small files a scan must open, and
      a file more than twice the rest's size waits for them (:func:`plan_compaction`).
    * ``max_rewrite_bytes=1 GiB``: the most input one pass rewrites, so a pass between two
      commits stays short (seconds) and memory stays bounded; the rest waits for the next.
    * ``orphan_age_s=3600``: a file no metadata references is deleted only after an hour, far
      longer than any icefloe write takes between writing a file and committing it.

    How often to run a pass is the caller's (``collector.maintenance_interval_s``, 300 s):
    each pass reads every retained manifest list, so running it every commit would be
    wasteful; every 5 minutes a 1 s table gains ~300 small files per partition, rewritten
    into one.
    """

    keep_last: int = 100
    max_snapshot_age_s: float = 600.0
    target_file_bytes: int = 128 * MiB
    min_input_files: int = 8
    max_rewrite_bytes: int = 1024 * MiB
    orphan_age_s: float = 3600.0


# --------------------------------------------------------------------------- compaction


@dataclass(slots=True)
class _Group:
    """Small files of one partition that become one output file."""

    files: list[DataFile] = field(default_factory=list)
    size: int = 0


def _table_name(table: Table) -> str:
    return ".".join(table.name())


def plan_compaction(table: Table, *, target_file_bytes: int = 128 * MiB,
                    min_input_files: int = 8, max_rewrite_bytes: int | None = None,
                    tiered: bool = True) -> list[list[DataFile]]:
    """Pick the groups of files :func:`compact` would rewrite (each group: one output file).

    A partition qualifies when it has at least ``min_input_files`` live data files smaller
    than ``target_file_bytes / 2``; its small files are bin-packed in commit order into
    groups of at most ``target_file_bytes`` input bytes. Files at least half the target are
    left alone: rewriting them again would cost I/O for little gain. So is a small file
    more than twice the size of all the partition's other small files together
    (:func:`_tiered`): a lightly fed partition's compacted file would otherwise be
    rewritten whole on every pass to absorb a few new small files, until it reached half
    the target (for a partition filling over hours, every byte written dozens of times);
    left alone until the others add up to half its size, it grows by half at least with
    each rewrite, so the times a byte is rewritten grow with the logarithm of target over
    small-file size, not with the number of passes (``tiered=False``: every small file is
    a candidate, the rule before it; ``bench/compaction_bench.py``'s baseline). Files of an
    older partition spec are skipped (rewriting them would silently repartition them), and a
    table with delete files is skipped whole: rewriting data without applying its deletes
    would resurrect deleted rows, and icefloe itself never writes deletes.
    """
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    spec_id = table.spec().spec_id
    small_limit = target_file_bytes // 2
    by_partition: dict[tuple[object, ...], list[tuple[int, str, DataFile]]] = {}
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            log.warning("table %s has delete files: compaction skipped", _table_name(table))
            return []
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if (data_file.content != DataFileContent.DATA or data_file.spec_id != spec_id
                    or data_file.file_size_in_bytes >= small_limit):
                continue
            key = _partition_key(data_file.partition)
            order = entry.sequence_number if entry.sequence_number is not None else 0
            by_partition.setdefault(key, []).append((order, data_file.file_path, data_file))

    groups: list[list[DataFile]] = []
    budget = max_rewrite_bytes
    for everything in by_partition.values():
        candidates = _tiered(everything) if tiered else everything
        if len(candidates) < min_input_files:
            continue
        candidates.sort(key=lambda item: (item[0], item[1]))
        packed: list[_Group] = [_Group()]
        for _, _, data_file in candidates:
            if packed[-1].files and packed[-1].size + data_file.file_size_in_bytes > \
                    target_file_bytes:
                packed.append(_Group())
            packed[-1].files.append(data_file)
            packed[-1].size += data_file.file_size_in_bytes
        for group in packed:
            if len(group.files) < 2:  # one file rewritten into one file gains nothing
                continue
            if budget is not None and groups and group.size > budget:
                return groups
            groups.append(group.files)
            if budget is not None:
                budget -= group.size
    return groups


def _tiered(candidates: list[tuple[int, str, DataFile]]) -> list[tuple[int, str, DataFile]]:
    """``candidates`` without the files each more than twice the size of all the remaining
    ones together (the largest first, then again): merging a file with much less than its
    own size rewrites it for little gain (see :func:`plan_compaction`)."""
    kept = sorted(candidates, key=lambda item: item[2].file_size_in_bytes)
    rest = sum(item[2].file_size_in_bytes for item in kept)
    while kept:
        largest = kept[-1][2].file_size_in_bytes
        if largest <= 2 * (rest - largest):
            break
        kept.pop()
        rest -= largest
    return kept


def compact(table: Table, *, epoch: int, target_file_bytes: int = 128 * MiB,
            min_input_files: int = 8, max_rewrite_bytes: int | None = None,
            clock: Clock = SYSTEM, tiered: bool = True) -> CompactionResult:
    """Rewrite small data files into target-sized ones in ONE snapshot (operation overwrite).

    Why it is safe for exactly-once: the commit carries ``icefloe.sequence`` and
    ``icefloe.epoch`` as read by :func:`committed_state` from this very ``table`` object, so
    the current snapshot keeps answering "how far did we get"; it refuses to run when the
    table records a newer epoch (``TableFencedError``, nothing written); and the overwrite
    asserts the branch head is still the snapshot it planned from, so if anyone committed
    since ``table`` was loaded the catalog rejects it with ``CommitFailedException`` (the
    table has ``commit.retry.num-retries=0``; with retries the default ``serializable``
    isolation still rejects a rebase over an append). On a rejected commit the files written
    for it are deleted again; reload the table and call again.

    Row contents are unchanged: files are read through pyiceberg's own scan (schema
    evolution and name mapping applied) and the row counts read and written are checked
    against the manifests before anything is committed.
    """
    started = clock.monotonic()
    confirm_in_place(table)  # a refusal that hides a landed commit must not delete its files
    name = _table_name(table)
    state = committed_state(table)
    check_epoch(name, state, epoch)
    _refuse_rebasing_retries(table)
    groups = plan_compaction(table, target_file_bytes=target_file_bytes,
                             min_input_files=min_input_files,
                             max_rewrite_bytes=max_rewrite_bytes, tiered=tiered)
    if not groups:
        return CompactionResult(seconds=clock.monotonic() - started)

    written: list[DataFile] = []
    commit_outcome_unknown = False
    try:
        write_uuid = uuid.uuid4()
        counter = itertools.count(0)
        rows = 0
        for group in groups:
            rows += _rewrite_group(table, group, write_uuid, counter, written)
        txn = table.transaction()
        props = summary_props(state.sequence, state.epoch, int(clock.time() * 1000),
                          state.sequences) \
            if _has_state(state) else {}
        props.update(carried_props(table))  # same rows: the same catalog version (and replay)
        with txn.update_snapshot(snapshot_properties=props).overwrite() as rewrite:
            for group in groups:
                for data_file in group:
                    rewrite.delete_data_file(data_file)
            for data_file in written:
                rewrite.append_data_file(data_file)
            snapshot_id = rewrite.snapshot_id
        commit_outcome_unknown = True
        txn.commit_transaction()
    except (CommitFailedException, ValidationException):
        _delete_quietly(table.io, [f.file_path for f in written])
        raise
    except BaseException:
        if not commit_outcome_unknown:  # failed before the commit: the files are ours alone
            _delete_quietly(table.io, [f.file_path for f in written])
        raise
    removed = [f for group in groups for f in group]
    result = CompactionResult(
        files_removed=len(removed), files_added=len(written), rows=rows,
        bytes_removed=sum(f.file_size_in_bytes for f in removed),
        bytes_added=sum(f.file_size_in_bytes for f in written),
        partitions=len({_partition_key(g[0].partition) for g in groups}),
        snapshot_id=snapshot_id, seconds=clock.monotonic() - started)
    log.info("compacted %s: %d files -> %d (%d rows) in %.2fs", name, result.files_removed,
             result.files_added, rows, result.seconds)
    return result


def _rewrite_group(table: Table, group: list[DataFile], write_uuid: uuid.UUID,
                   counter: itertools.count[int], written: list[DataFile]) -> int:
    """Read one group through pyiceberg's scan and write it back; return the row count.

    The writer is the output paths' own (:class:`~pipeline.iceberg.data_files.TableFiles`:
    the table's field ids, writer settings, sort order, and no uuid statistics unless
    ``icefloe.uuid-bounds = write``), one file per group: the group is already sized by
    its on-disk bytes (a target size would split by *in-memory* Arrow bytes, 3-10x larger).
    New files are appended to ``written`` as soon as they exist, so the caller can delete
    them if anything later fails.
    """
    expected = sum(f.record_count for f in group)
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    arrow = scan.to_table([FileScanTask(f) for f in group])
    if arrow.num_rows != expected:
        raise ValueError(f"compaction read {arrow.num_rows} rows from {len(group)} files of "
                         f"{_table_name(table)}, the manifests say {expected}: aborted")
    _check_pyarrow_schema_compatible(table.schema(), arrow.schema,
                                     format_version=table.metadata.format_version)
    # The group is one partition (plan_compaction); TableFiles sorts by the sort order.
    target = TableTarget.of("compaction", table, [(n, n) for n in arrow.column_names])
    target = msgspec.structs.replace(target, properties={
        k: v for k, v in target.properties.items()
        if k != TableProperties.WRITE_TARGET_FILE_SIZE_BYTES})
    files = TableFiles(target, write_uuid.hex, f"compact{next(counter)}")
    try:
        files.add(arrow)
        refs = files.close()
    except BaseException:
        files.discard()
        raise
    try:
        for ref in refs:
            written.append(data_file_entry(table, ref))
    except BaseException:
        delete_files(table.io, [ref.path for ref in refs[len(written):]])
        raise
    out_rows = sum(ref.rows for ref in refs)
    if out_rows != expected:
        raise ValueError(f"compaction wrote {out_rows} rows for {expected} read: aborted")
    return expected


def _has_state(state: CommittedState) -> bool:
    return state.snapshot_id is not None


def _refuse_rebasing_retries(table: Table) -> None:
    """Refuse a table on which pyiceberg would silently rebase our rewrite.

    A rebased compaction would carry a stale ``icefloe.sequence`` over a newer append and
    make the collector replay (duplicate) it. pyiceberg only rebases with retries enabled,
    and then ``serializable`` isolation (the default) still rejects any concurrent append.
    """
    props = table.properties
    retries = props.get(TableProperties.COMMIT_NUM_RETRIES,
                        str(TableProperties.COMMIT_NUM_RETRIES_DEFAULT))
    isolation = props.get(TableProperties.WRITE_UPDATE_ISOLATION_LEVEL,
                          TableProperties.WRITE_ISOLATION_LEVEL_DEFAULT)
    if retries.strip() != "0" and isolation != "serializable":
        raise ValueError(f"table {_table_name(table)} retries commits with {isolation} "
                         "isolation: a compaction could rebase over an append; set "
                         "commit.retry.num-retries=0")


# --------------------------------------------------------------------------- expiry


def expire_snapshots(table: Table, *, keep_last: int, max_age_s: float,
                     now_ms: int | None = None, clock: Clock = SYSTEM) -> int:
    """Expire snapshots outside the newest ``keep_last`` that are older than ``max_age_s``.

    Metadata only (pyiceberg's ``table.maintenance.expire_snapshots()``): the files those
    snapshots referenced are removed by :func:`delete_unreachable_files`. Never expired: the
    current snapshot, branch and tag heads, the newest snapshot carrying
    ``icefloe.sequence`` and every snapshot between it and the current one — expiring one of
    those would orphan its child's parent pointer, :func:`committed_state` would stop short
    and the collector would replay (duplicate) everything. Returns how many were expired.

    pyiceberg commits the removal with no requirement on the branch head (the catalog applies
    it to whatever metadata is current). That is safe here: a commit landing meanwhile only
    moves the protected chain forward, onto snapshots this call never selects.

    Age is ``now_ms`` (default: ``clock``, the store's) minus the snapshot's
    :func:`~pipeline.iceberg.commit.committed_at_ms`; "newest" is commit order (the snapshot's
    sequence number), which no host clock can reorder.
    """
    if keep_last < 0 or max_age_s < 0:
        raise ValueError("keep_last and max_age_s must not be negative")
    metadata = table.metadata
    now_ms = int(clock.time() * 1000) if now_ms is None else now_ms
    cutoff_ms = now_ms - int(max_age_s * 1000)
    protected = {ref.snapshot_id for ref in metadata.refs.values()}
    state = committed_state(table)
    snapshot = table.current_snapshot()
    while snapshot is not None:  # current → ... → newest sequence-bearing snapshot
        protected.add(snapshot.snapshot_id)
        if state.snapshot_id is None or snapshot.snapshot_id == state.snapshot_id:
            break
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    newest_first = sorted(metadata.snapshots,
                          key=lambda s: (s.sequence_number or 0, committed_at_ms(s)),
                          reverse=True)
    victims = [s.snapshot_id for s in newest_first[keep_last:]
               if committed_at_ms(s) < cutoff_ms and s.snapshot_id not in protected]
    if victims:
        table.maintenance.expire_snapshots().by_ids(victims).commit()
        log.info("expired %d snapshots of %s", len(victims), _table_name(table))
    return len(victims)


# --------------------------------------------------------------------------- deletion


def delete_unreachable_files(table: Table, *, older_than_s: float,
                             previous: TableMetadata | None = None,
                             now_s: float | None = None, clock: Clock = SYSTEM
                             ) -> DeletionResult:
    """Delete the table's files that its current metadata no longer needs.

    Reachable (never deleted): the current metadata.json and those in its metadata log,
    statistics files, and for every kept snapshot its manifest list, its manifests and the
    files live in it. A manifest entry with status DELETED is not counted: Iceberg lists
    every live file of a snapshot as ADDED/EXISTING in its own manifests, so a file only
    named as DELETED (e.g. the inputs of a compaction whose parent expired) is needed by no
    kept snapshot.

    Everything else is deleted when it is provably dead or old enough:

    * a ``NNNNN-*.metadata.json`` whose version is at most the current one: new commits
      always write a higher version, so it is superseded or lost its commit race;
    * a file reachable from ``previous`` (the metadata before this pass's expiry; what
      :func:`run_maintenance` passes) but not from the current one: it was committed and
      its last snapshot expired, so no new commit can adopt it;
    * any other file once it is older than ``older_than_s`` (orphans of failed or crashed
      commits). Younger ones may be written by a commit still in flight and are kept.
      Age is ``now_s`` (default: ``clock``, the store's) minus the file's modification
      time, which the store stamps: both are the store's clock.

    The table is refreshed first so the newest metadata decides. Only the table location is
    listed (see :func:`_list_files`); listing uses the FileIO's own pyarrow filesystem
    (endpoint and credentials of an S3 FileIO included); deletes go through ``table.io``.
    ``bytes`` in the result counts listed files only.
    """
    started = clock.monotonic()
    if older_than_s < 0:
        raise ValueError("older_than_s must not be negative")
    table.refresh()
    io = table.io
    reachable = referenced(table.metadata, table.metadata_location, io)
    # Known dead: deleted by path, wherever they live (even outside the table location).
    doomed: dict[str, tuple[str, int]] = {}
    if previous is not None:
        for key, uri in referenced(previous, None, io).items():
            if key not in reachable:
                doomed[key] = (uri, 0)
    cutoff_ns = int(((clock.time() if now_s is None else now_s) - older_than_s) * 1e9)
    kept_young = _doom_listed(table, reachable, doomed, cutoff_ns)
    targets = list(doomed.values())
    deleted_bytes, errors = _delete_all(io, targets)
    result = DeletionResult(deleted=len(targets) - errors, bytes=deleted_bytes,
                            kept_young=kept_young, errors=errors, reachable=len(reachable),
                            seconds=clock.monotonic() - started)
    log.info("deleted %d unreachable files (%d bytes) of %s; kept %d young, %d errors",
             result.deleted, result.bytes, _table_name(table), kept_young, errors)
    return result


def _doom_listed(table: Table, reachable: dict[str, str],
                 doomed: dict[str, tuple[str, int]], cutoff_ns: int) -> int:
    """Add each listed file of the table that is unreachable and superseded or older than
    ``cutoff_ns`` to ``doomed``; returns how many unreachable ones are kept as young."""
    current_version = _metadata_version(table.metadata_location)
    kept_young = 0
    for uri, size, mtime_ns in _list_files(table):
        key = normalize(uri)
        base = key.rsplit("/", 1)[-1]
        if key in reachable or base in _NEVER_DELETE:
            continue
        version = _metadata_version(base)
        superseded = (version is not None and current_version is not None
                      and version <= current_version)
        if key in doomed or superseded or mtime_ns < cutoff_ns:
            doomed[key] = (uri, size)
        else:
            kept_young += 1
    return kept_young


def _delete_all(io: FileIO, targets: list[tuple[str, int]]) -> tuple[int, int]:
    """Delete ``targets`` (uri, size) in parallel; bytes deleted and failed deletes."""
    errors = 0
    deleted_bytes = 0
    with ThreadPoolExecutor(_IO_THREADS) as pool:
        for (_uri, size), ok in zip(targets, pool.map(lambda d: _delete(io, d[0]), targets),
                                    strict=True):
            if ok:
                deleted_bytes += size
            else:
                errors += 1
    return deleted_bytes, errors


def _metadata_version(location: str | None) -> int | None:
    if not location:
        return None
    match = _METADATA_JSON.match(location.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def _list_files(table: Table) -> Iterator[tuple[str, int, int]]:
    """Yield ``(uri, size, mtime_ns)`` of every file under the table location.

    Only the location the table owns is listed, not ``write.data.path`` or
    ``write.metadata.path``: those may be shared with other tables, whose files would all
    look like orphans here. Dead files there are still deleted by path (``previous``).
    """
    root = table.location().rstrip("/")
    fs, scheme, path = _filesystem(table.io, root)
    # A table location must be a directory of its own: listing a bucket root or "/" would
    # put unrelated data at the mercy of the orphan rule.
    if len([p for p in path.split("/") if p]) < 2:
        raise ValueError(f"refusing to sweep {root!r}: not a table-owned directory")
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        uri = f"file://{info.path}" if scheme == "file" else f"{scheme}://{info.path}"
        yield uri, info.size or 0, info.mtime_ns or 0


def _filesystem(io: FileIO, root: str) -> tuple[pafs.FileSystem, str, str]:
    """A pyarrow filesystem that can list ``root``, configured like the table's FileIO."""
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = PyArrowFileIO.parse_location(root, io.properties)
        return io.fs_by_scheme(scheme, netloc), scheme, path
    parsed = urlparse(root)
    scheme = parsed.scheme or "file"
    if scheme in ("s3", "s3a", "s3n"):
        props = io.properties
        fs = pafs.S3FileSystem(
            endpoint_override=props.get("s3.endpoint"),
            access_key=props.get("s3.access-key-id"),
            secret_key=props.get("s3.secret-access-key"),
            session_token=props.get("s3.session-token"),
            region=props.get("s3.region") or props.get("client.region"),
        )
        return fs, scheme, f"{parsed.netloc}{parsed.path}"
    fs, path = pafs.FileSystem.from_uri(root if parsed.scheme else f"file://{root}")
    return fs, scheme, path


def _delete(io: FileIO, uri: str) -> bool:
    try:
        io.delete(uri)
    except FileNotFoundError:
        return True
    except Exception as exc:
        log.warning("cannot delete %s: %s", uri, exc)
        return False
    return True


def _delete_quietly(io: FileIO, uris: Iterable[str]) -> None:
    for uri in uris:
        _delete(io, uri)


# --------------------------------------------------------------------------- one pass


def run_maintenance(table: Table, *, epoch: int,
                    settings: MaintenanceSettings | None = None,
                    clock: Clock = SYSTEM) -> MaintenanceReport:
    """Compact, then expire, then delete: the order that frees the most in one pass.

    Compaction first, so the small files it replaces become unreachable as soon as the
    snapshots still naming them expire; expiry second; deletion last, handed the metadata
    from before the pass so files of snapshots expired now are removed at once instead of
    waiting for the orphan safety age. A fenced collector stops before touching anything
    (``TableFencedError``); a ``CommitFailedException`` means someone committed meanwhile:
    reload the table and re-check, as for appends. ``clock``: the store's (see above).
    """
    started = clock.monotonic()
    cfg = settings or MaintenanceSettings()
    confirm_in_place(table)  # a lost-answer commit is judged by the table (confirm.py)
    check_epoch(_table_name(table), committed_state(table), epoch)
    before = table.metadata
    compaction = compact(table, epoch=epoch, target_file_bytes=cfg.target_file_bytes,
                         min_input_files=cfg.min_input_files,
                         max_rewrite_bytes=cfg.max_rewrite_bytes, clock=clock)
    expired = expire_snapshots(table, keep_last=cfg.keep_last,
                               max_age_s=cfg.max_snapshot_age_s, clock=clock)
    deletion = delete_unreachable_files(table, older_than_s=cfg.orphan_age_s, previous=before,
                                        clock=clock)
    return MaintenanceReport(_table_name(table), compaction, expired, deletion,
                             clock.monotonic() - started)


def _partition_key(partition: Record | None) -> tuple[object, ...]:
    """A data file's partition values as a hashable tuple (``()``: unpartitioned). A
    pyiceberg ``Record`` iterates by index only, which the type checker does not follow."""
    if partition is None:
        return ()
    return tuple(partition[i] for i in range(len(partition)))
