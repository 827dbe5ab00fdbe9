"""Unknown commit outcomes at the catalog: a commit lands once, and no cleanup deletes a
file the table references.

The faults sit at the catalog's HTTP boundary: Glue is moto behind
:class:`glue_faults.GlueFaultApp` (with AWS's ``VersionId`` check), REST is the small
server in :mod:`rest_catalog_server`. A commit is applied and its answer lost (a 5xx, or
the connection cut), or answered with an error without being applied. Either way
``commit_rows`` — with pyiceberg's append and with :class:`WriteThenAdd` and its cleanup —
must leave the rows in the table exactly once, record the sequence once, and leave every
metadata and data file of every snapshot in place and readable.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import msgspec
import pyarrow as pa
import pytest
from collector_support import CLICKS
from glue_faults import GlueServer, UpdateFault
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from rest_catalog_server import CommitFault, RestCatalogServer
from test_file_append import clicks

from icefloe.config import CatalogSection
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import SEQUENCE_PROP, CommitResult, commit_rows, committed_state
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.maintenance import MaintenanceSettings, run_maintenance
from pipeline.iceberg.tables import ensure_stream_table

FAULTS = ["applied-500", "applied-cut", "not-applied"]


@pytest.fixture(scope="module")
def glue_server(aws_test_env: None) -> Iterator[GlueServer]:
    server = GlueServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def rest_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCatalogServer]:
    server = RestCatalogServer(tmp_path_factory.mktemp("rest-catalog"))
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Faulty:
    """A catalog and a way to make its next commit go wrong (``inject(kind)``)."""

    catalog: Catalog
    inject: Callable[[str], Any]
    fired: Callable[[], bool]
    endpoint: str | None = None


def _glue(server: GlueServer) -> Faulty:
    bucket = f"icefloe-glue-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    creds = {"access-key-id": "testing", "secret-access-key": "testing", "region": "us-east-1"}
    props = {"glue.endpoint": server.endpoint, "s3.endpoint": server.endpoint,
             "glue.max-retries": "2",  # botocore: 3 tries of each call, short back-off
             **{f"glue.{k}": v for k, v in creds.items()},
             **{f"s3.{k}": v for k, v in creds.items()}}
    catalog = open_catalog(CatalogSection(type="glue", warehouse=f"s3://{bucket}/wh",
                                          properties=props))
    server.faults.rules.clear()

    def inject(kind: str) -> UpdateFault:
        # botocore retries a lost answer; an unapplied fault outlasts its three tries.
        rule = UpdateFault(applied=kind != "not-applied", drop=kind == "applied-cut",
                           times=3 if kind == "not-applied" else 1)
        server.faults.rules.append(rule)
        return rule

    return Faulty(catalog, inject, lambda: all(r.fired == r.times for r in server.faults.rules),
                  server.endpoint)


def _rest(server: RestCatalogServer, root: Path) -> Faulty:
    catalog = open_catalog(CatalogSection(type="rest", uri=server.uri,
                                          warehouse=(root / "unused").as_uri()))
    server.faults.rules.clear()

    def inject(kind: str) -> CommitFault:
        return server.faults.add(CommitFault(applied=kind != "not-applied",
                                             drop=kind == "applied-cut",
                                             status=504 if kind == "applied-500" else 500))

    return Faulty(catalog, inject, lambda: all(r.fired == r.times for r in server.faults.rules))


@pytest.fixture(params=["glue", "rest"])
def faulty(request: pytest.FixtureRequest, tmp_path: Path) -> Faulty:
    if request.param == "glue":
        return _glue(request.getfixturevalue("glue_server"))
    return _rest(request.getfixturevalue("rest_server"), tmp_path)


def assert_intact(table: Table) -> None:
    """Every metadata file of every snapshot and every live data file exists and reads."""
    io = table.io
    for snapshot in table.snapshots():
        assert io.new_input(snapshot.manifest_list).exists(), snapshot.manifest_list
        for manifest in snapshot.manifests(io):
            assert io.new_input(manifest.manifest_path).exists(), manifest.manifest_path
    for task in table.scan().plan_files():
        assert io.new_input(task.file.file_path).exists(), task.file.file_path
    table.scan().to_arrow()  # reads every live file


def referenced_data_files(table: Table) -> set[str]:
    """Data files any snapshot of ``table`` references, as paths under its ``data/``."""
    return {_under_data(entry.data_file.file_path) for snapshot in table.snapshots()
            for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)}


def stored_data_files(table: Table, endpoint: str | None) -> set[str]:
    """Data files under the table's ``data/``, in S3 (Glue) or a local warehouse (REST)."""
    location = table.location().rstrip("/") + "/data/"
    if location.startswith("s3://"):
        bucket, prefix = location[len("s3://"):].split("/", 1)
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {_under_data(o["Key"]) for page in pages for o in page.get("Contents", [])
                if not o["Key"].endswith("/")}  # pyarrow's directory markers
    root = Path(unquote(urlsplit(location).path))
    return {_under_data(p.as_posix()) for p in root.rglob("*.parquet")}


def _under_data(path: str) -> str:
    return unquote(path).split("/data/", 1)[1]


def snapshots_with_sequence(table: Table, sequence: int) -> int:
    return sum(1 for s in table.snapshots()
               if s.summary and s.summary.additional_properties.get(SEQUENCE_PROP)
               == str(sequence))


def _table(catalog: Catalog) -> str:
    stream = msgspec.structs.replace(CLICKS, table=f"t{uuid.uuid4().hex[:10]}.clicks")
    ensure_stream_table(catalog, stream)
    return stream.table


def _commit(catalog: Catalog, name: str, rows: pa.Table, sequence: int, how: str
            ) -> CommitResult:
    """``commit_rows`` with pyiceberg's append or WriteThenAdd (and its cleanup, always)."""
    if how == "append":
        return commit_rows(catalog, name, rows, sequence=sequence, epoch=1)
    append = WriteThenAdd("clicks")
    try:
        return commit_rows(catalog, name, rows, sequence=sequence, epoch=1, append=append)
    finally:
        append.cleanup(catalog, name, sequence=sequence, epoch=1)


@pytest.mark.parametrize("how", ["append", "write-then-add"])
@pytest.mark.parametrize("kind", FAULTS)
def test_unknown_outcome_commits_once_and_keeps_its_files(faulty: Faulty, kind: str,
                                                          how: str) -> None:
    name = _table(faulty.catalog)
    _commit(faulty.catalog, name, clicks(5, sequence=1), 1, how)
    faulty.inject(kind)
    outcome = _commit(faulty.catalog, name, clicks(7, sequence=2), 2, how)
    assert faulty.fired()
    # A commit that landed is reported as committed rows, not as a replay.
    assert (outcome.sequence, outcome.rows, outcome.replayed) == (2, 7, 0)

    table = faulty.catalog.load_table(name)
    assert_intact(table)
    ids = table.scan().to_arrow().column("_event_id").to_pylist()
    assert sorted(ids) == sorted([f"e1-{i}" for i in range(5)] + [f"e2-{i}" for i in range(7)])
    assert snapshots_with_sequence(table, 2) == 1
    assert committed_state(table).sequence == 2
    if how == "write-then-add":  # and the cleanup leaves no file of a try that did not land
        assert stored_data_files(table, faulty.endpoint) == referenced_data_files(table)

    # A replay of the same run (a restart before the ack) adds nothing.
    _commit(faulty.catalog, name, clicks(7, sequence=2), 2, how)
    again = faulty.catalog.load_table(name)
    assert again.scan().to_arrow().num_rows == 12
    assert again.current_snapshot() == table.current_snapshot()


@pytest.mark.parametrize("how", ["append", "write-then-add"])
def test_rest_conflict_after_an_applied_commit_is_confirmed(
        rest_server: RestCatalogServer, tmp_path: Path, how: str) -> None:
    """A gateway that retried an applied commit answers 409: the table says it landed."""
    faulty = _rest(rest_server, tmp_path)
    name = _table(faulty.catalog)
    rest_server.faults.add(CommitFault(applied=True, status=409))
    outcome = _commit(faulty.catalog, name, clicks(7, sequence=2), 2, how)
    assert (outcome.sequence, outcome.rows, outcome.attempts) == (2, 7, 1)
    table = faulty.catalog.load_table(name)
    assert_intact(table)
    assert table.scan().to_arrow().num_rows == 7
    assert snapshots_with_sequence(table, 2) == 1
    assert stored_data_files(table, None) == referenced_data_files(table)


@pytest.mark.parametrize("kind", FAULTS)
def test_unknown_outcome_compaction_keeps_the_files_it_committed(faulty: Faulty,
                                                                 kind: str) -> None:
    """A compaction whose commit landed but whose answer was lost (or refused on a retry)
    must not delete the files it wrote: the table's current snapshot references them."""
    name = _table(faulty.catalog)
    for sequence in range(1, 5):
        _commit(faulty.catalog, name, clicks(3, sequence=sequence), sequence, "append")
    table = faulty.catalog.load_table(name)
    faulty.inject(kind)
    settings = MaintenanceSettings(min_input_files=2)
    if kind == "not-applied":  # an error without the commit: outcome unknown, files kept
        with pytest.raises(Exception):  # noqa: B017, PT011 — Glue and REST raise differently
            run_maintenance(table, epoch=1, settings=settings)
    else:  # applied, answer lost or refused on the retry: confirmed by the table
        assert run_maintenance(table, epoch=1, settings=settings).compaction.files_added == 1
    assert faulty.fired()
    after = faulty.catalog.load_table(name)
    assert_intact(after)
    assert after.scan().to_arrow().num_rows == 12
    assert committed_state(after).sequence == 4
    assert referenced_data_files(after) <= stored_data_files(after, faulty.endpoint)
