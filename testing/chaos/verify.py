"""The end of a chaos run: compare what clients were told with what the tables hold.

Why pyiceberg and not ``icefloe query``: the check must not share code with the path it
checks. The tables are read straight from the catalog with pyiceberg scans; the ids are
compared with the clients' ledgers; the manifest and the store are read directly.

Freshness comes from the same tables: each commit records the highest manifest sequence it
holds (``icefloe.sequence``), so a row with ``_sequence`` s became visible with the first
snapshot whose sequence reached s; that snapshot's time minus the row's ``_received_at`` is
the row's freshness.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from icefloe.config import Config
from icefloe.manifest import load
from icefloe.manifest.publish import BATCH_PREFIX
from icefloe.store import open_async_store, options_for

if TYPE_CHECKING:
    from pyiceberg.table.snapshots import Snapshot


@dataclass
class TableRows:
    ids: list[str]
    sequences: np.ndarray
    received_ms: np.ndarray
    commit_ms: np.ndarray  # when each row became visible


@dataclass
class Verdict:
    acked: int
    unacked: int
    committed: int
    lost: list[str] = field(default_factory=list)
    duplicates: dict[str, list[int]] = field(default_factory=dict)  # id -> its _sequence values
    phantoms: list[str] = field(default_factory=list)
    unacked_stored: int = 0
    dead_letters: int = 0
    manifest_entries: int = 0
    leaked_batch_files: int = 0
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def read_table(config: Config, name: str) -> TableRows | None:
    """Every row's id, sequence, receive time and visibility time (None: no table)."""
    from pyiceberg.exceptions import NoSuchTableError

    from pipeline.iceberg.catalog import open_catalog
    from pipeline.iceberg.commit import SEQUENCE_PROP

    try:
        table = open_catalog(config.catalog).load_table(name)
    except NoSuchTableError:
        return None
    rows = table.scan(selected_fields=("id", "_sequence", "_received_at")).to_arrow()
    received = rows.column("_received_at").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
    sequences = rows.column("_sequence").to_numpy(zero_copy_only=False)
    # first visibility of each sequence: snapshots in commit order, keep each new maximum
    marks: list[tuple[int, int]] = []
    for snapshot in sorted(table.snapshots(), key=lambda s: s.timestamp_ms):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if SEQUENCE_PROP in props:
            seq = int(props[SEQUENCE_PROP])
            if not marks or seq > marks[-1][0]:
                marks.append((seq, snapshot.timestamp_ms))
    bounds = np.array([m[0] for m in marks], dtype=np.int64)
    times = np.array([m[1] for m in marks], dtype=np.int64)
    where = np.searchsorted(bounds, sequences, side="left")
    commit = times[np.minimum(where, len(times) - 1)] if len(times) else np.zeros(0, np.int64)
    return TableRows(rows.column("id").to_pylist(), sequences,
                     received.to_numpy(zero_copy_only=False), commit)


def row_count(config: Config, name: str) -> int:
    """Rows in a table's current snapshot (0 if it does not exist)."""
    from pyiceberg.exceptions import NoSuchTableError

    from pipeline.iceberg.catalog import open_catalog

    try:
        table = open_catalog(config.catalog).load_table(name)
    except NoSuchTableError:
        return 0
    return total_records(table.current_snapshot())


def total_records(snapshot: Snapshot | None) -> int:
    """Rows as of ``snapshot``: its summary's ``total-records`` (0 without one).

    Read here rather than through the CLI's helper of the same name: the harness is an
    independent reader, and the composition root (``icefloe_app``) is imported by nothing
    but the ``python -m icefloe`` shim (tests/system/test_layers.py).
    """
    if snapshot is None or snapshot.summary is None:
        return 0
    value = snapshot.summary.additional_properties.get("total-records")
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


async def manifest_and_leaks(config: Config) -> tuple[int, int]:
    """Entries left in the manifest, and batch files left after a final GC pass.

    The final pass uses no grace period: every producer is stopped, so a batch file not in
    the manifest can only be garbage. Any file still there afterwards leaked.
    """
    from collector.gc import collect_garbage

    store = open_async_store(config.store.url, options_for(config.store.endpoint_url,
                                                          config.store.region),
                             control_url=config.store.control_url)
    try:
        loaded = await load(store, config.manifest.key)
        await collect_garbage(store, config.manifest.key, grace_s=0.0)
        left = await store.list(BATCH_PREFIX)
        return len(loaded.manifest.entries), len(left.objects)
    finally:
        await store.close()


def verify(config: Config, tables: dict[str, TableRows | None], acked: set[str],
           unacked: set[str]) -> Verdict:
    counts: Counter[str] = Counter()
    sequences: dict[str, list[int]] = {}
    for rows in tables.values():
        if rows is None:
            continue
        counts.update(rows.ids)
        for row_id, seq in zip(rows.ids, rows.sequences.tolist(), strict=True):
            sequences.setdefault(row_id, []).append(seq)
    committed = set(counts)
    verdict = Verdict(acked=len(acked), unacked=len(unacked), committed=sum(counts.values()))
    verdict.lost = sorted(acked - committed)
    verdict.duplicates = {i: sequences[i] for i, c in counts.items() if c > 1}
    verdict.phantoms = sorted(committed - acked - unacked)
    verdict.unacked_stored = len(unacked & committed)
    verdict.dead_letters = row_count(config, "icefloe.dead_letters")
    verdict.manifest_entries, verdict.leaked_batch_files = asyncio.run(
        manifest_and_leaks(config))
    verdict.checks = {
        "every acknowledged event committed": not verdict.lost,
        "no event committed twice": not verdict.duplicates,
        "no event committed that was never sent": not verdict.phantoms,
        "no dead letters for valid input": verdict.dead_letters == 0,
        "manifest fully consumed": verdict.manifest_entries == 0,
        "no batch file leaked after GC": verdict.leaked_batch_files == 0,
    }
    return verdict


def freshness(tables: dict[str, TableRows | None],
              windows: list[tuple[float, float]]) -> dict[str, Any]:
    """p50/p99 of visibility delay (s), overall and for rows received during faults."""
    delays, faulty = [], []
    for rows in tables.values():
        if rows is None or not len(rows.ids):
            continue
        delay = (rows.commit_ms - rows.received_ms) / 1000.0
        delays.append(delay)
        received_s = rows.received_ms / 1000.0
        inside = np.zeros(len(received_s), dtype=bool)
        for start, end in windows:
            inside |= (received_s >= start) & (received_s <= end)
        faulty.append(delay[inside])

    def quantiles(parts: list[np.ndarray]) -> dict[str, float | None]:
        values = np.concatenate(parts) if parts else np.zeros(0)
        if not len(values):
            return {"p50": None, "p99": None, "max": None}
        return {"p50": round(float(np.percentile(values, 50)), 3),
                "p99": round(float(np.percentile(values, 99)), 3),
                "max": round(float(values.max()), 3)}

    return {"all": quantiles(delays), "during_faults": quantiles(faulty)}
