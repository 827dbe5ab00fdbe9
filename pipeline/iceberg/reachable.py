"""Every file a table's metadata references, for the orphan sweep, without re-reading what
cannot have changed.

Why a cache: to tell an orphan from a live file the sweep needs every path named by every
snapshot: each snapshot's manifest list and each manifest's data files. With snapshots kept
for a day that is hundreds of Avro reads per table per pass, growing with the history, and
the sweep ran twice per pass (the table now and before the pass). In a chaos run it held a
collector's next run back 12 s. But a manifest list and a manifest are immutable: Iceberg
writes each under a new name and never rewrites it. So what a path lists is read once per
process and kept (bounded, least recently used first out); a pass reads only the manifests
the commits since the last pass wrote.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar
from urllib.parse import urlparse

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestFile
from pyiceberg.table.metadata import TableMetadata

_IO_THREADS = 8
_T = TypeVar("_T")


class ImmutableReads(Generic[_T]):
    """What immutable files list, by path: at most ``max_paths`` kept, the least recently
    used dropped first. Thread-safe (maintenance may run from several worker threads)."""

    def __init__(self, max_paths: int = 100_000) -> None:
        self.max_paths = max_paths
        self._kept: OrderedDict[str, tuple[_T, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0
        """Files actually read (the rest came from the cache)."""

    def get_many(self, paths: Iterable[str], read: Callable[[str], tuple[_T, ...]],
                 pool: ThreadPoolExecutor) -> dict[str, tuple[_T, ...]]:
        """``{path: what it lists}``, reading (in ``pool``) only the paths not kept."""
        found: dict[str, tuple[_T, ...]] = {}
        missing: list[str] = []
        with self._lock:
            for path in paths:
                kept = self._kept.get(path)
                if kept is None:
                    missing.append(path)
                else:
                    self._kept.move_to_end(path)
                    found[path] = kept
        fresh = dict(zip(missing, pool.map(read, missing), strict=True))
        with self._lock:
            self.reads += len(fresh)
            for path, listed in fresh.items():
                self._kept[path] = listed
            while len(self._kept) > self.max_paths:
                self._kept.popitem(last=False)
        return found | fresh


MANIFEST_LISTS: ImmutableReads[ManifestFile] = ImmutableReads()
"""Manifest list path -> the manifests it lists."""
MANIFESTS: ImmutableReads[str] = ImmutableReads()
"""Manifest path -> the live (not deleted) data and delete file paths it lists."""


def referenced(metadata: TableMetadata, metadata_location: str | None, io: FileIO
              ) -> dict[str, str]:
    """Every location ``metadata`` references, keyed by :func:`normalize` form."""
    paths = {entry.metadata_file for entry in metadata.metadata_log}
    if metadata_location:
        paths.add(metadata_location)
    paths.update(s.statistics_path for s in metadata.statistics)
    paths.update(s.statistics_path for s in metadata.partition_statistics)
    by_list = {s.manifest_list: s for s in metadata.snapshots}
    with ThreadPoolExecutor(_IO_THREADS) as pool:
        lists = MANIFEST_LISTS.get_many(
            by_list, lambda path: tuple(by_list[path].manifests(io)), pool)
        paths.update(by_list)
        manifests = {m.manifest_path: m for listed in lists.values() for m in listed}
        paths.update(manifests)
        for listed in MANIFESTS.get_many(
                manifests, lambda path: _files_of(io, manifests[path]), pool).values():
            paths.update(listed)
    return {normalize(p): p for p in paths}


def _files_of(io: FileIO, manifest: ManifestFile) -> tuple[str, ...]:
    """The live file paths of one manifest (its entries not marked deleted)."""
    return tuple(e.data_file.file_path
                 for e in manifest.fetch_manifest_entry(io, discard_deleted=True))


def normalize(location: str) -> str:
    """A location as ``bucket/key`` (object stores) or an absolute path (local files).

    Manifests may spell one object ``s3a://b/k`` and a listing ``b/k``; comparing these
    forms keeps a referenced file from looking unreferenced. No percent-decoding: paths are
    compared exactly as written.
    """
    parsed = urlparse(location)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # "C:\\..." is local too
        return os.path.abspath(parsed.path if parsed.scheme == "file" else location)
    return f"{parsed.netloc}{parsed.path}"
