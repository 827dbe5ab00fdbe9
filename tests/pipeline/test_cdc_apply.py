"""Change streams (#42) applied by the upsert on a real SQLite catalog: the source position
orders a key's changes over the accepted order, stale changes and deletes of unknown keys
are counted no-ops, a key update (delete + create) moves the row, a replay applies once."""

from __future__ import annotations

import datetime as dt

import msgspec
import pyarrow as pa
import pytest
from collector_support import collector_config

from icefloe.clock import ManualClock
from icefloe.config import Column, StreamConfig
from icefloe.streams.cdc import change_id, encode_position, with_cdc_columns
from icefloe.streams.model import CdcConfig
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.cdc_apply import STALE, UNKNOWN_DELETE
from pipeline.iceberg.table_commit import commit_table
from pipeline.iceberg.tables import ensure_stream_table

CUSTOMERS = with_cdc_columns([StreamConfig(
    name="customers", table="shop.customers", primary_key=("id",), partition="none",
    columns=(Column("id", "long", required=True), Column("email", "string")),
    cdc=CdcConfig(before_columns=("email",)))], "test")[0]
BASE = dt.datetime(2026, 12, 2, 12, tzinfo=dt.UTC)
Change = tuple[str, int, str | None, int]  # op, key, email, position (lsn)


def changes(items: list[Change], sequence: int) -> pa.Table:
    rows = []
    for op, key, email, lsn in items:
        position = encode_position([lsn])
        rows.append({"id": key, "email": None if op == "d" else email, "_cdc_op": op,
                     "_cdc_position": position, "_cdc_deleted": op == "d",
                     "before_email": None, "_event_id": change_id(position, [key]),
                     "_received_at": BASE, "_sequence": sequence})
    return pa.Table.from_pylist(rows, schema=table_arrow_schema(CUSTOMERS))


@pytest.fixture
def catalog(tmp_path):
    catalog = open_catalog(collector_config(tmp_path, streams=(CUSTOMERS,)).catalog)
    ensure_stream_table(catalog, CUSTOMERS)
    return catalog


def apply(catalog, items: list[Change], sequence: int):
    return commit_table(catalog, "shop.customers", changes(items, sequence), sequence=sequence,
                        epoch=1, clock=ManualClock(0.0), version=None, stream=CUSTOMERS)


def table(catalog) -> dict[int, tuple[str | None, str]]:
    rows = catalog.load_table("shop.customers").scan().to_arrow().to_pylist()
    assert len(rows) == len({r["id"] for r in rows}), "a key is in the table twice"
    return {r["id"]: (r["email"], r["_cdc_position"]) for r in rows}


def test_the_source_position_orders_a_keys_changes_not_the_accepted_order(catalog):
    outcome = apply(catalog, [("u", 1, "newest", 12), ("c", 1, "first", 10),
                              ("u", 1, "middle", 11), ("r", 2, "snap", 5)], 1)
    assert table(catalog) == {1: ("newest", encode_position([12])),
                              2: ("snap", encode_position([5]))}
    assert outcome.noops == ()


def test_a_change_older_than_the_stored_position_is_a_counted_noop(catalog):
    apply(catalog, [("c", 1, "v20", 20), ("c", 2, "keep", 20)], 1)
    outcome = apply(catalog, [("u", 1, "late", 15), ("u", 1, "later", 18), ("d", 2, None, 19),
                              ("u", 1, "same", 20)], 2)
    assert table(catalog) == {1: ("v20", encode_position([20])),
                              2: ("keep", encode_position([20]))}
    assert dict(outcome.noops) == {STALE: 4}
    newer = apply(catalog, [("u", 1, "v21", 21), ("d", 2, None, 22)], 3)
    assert table(catalog) == {1: ("v21", encode_position([21]))}
    assert newer.noops == ()


def test_a_delete_of_a_key_never_seen_is_a_counted_noop(catalog):
    apply(catalog, [("c", 1, "a", 1)], 1)
    outcome = apply(catalog, [("d", 99, None, 2), ("c", 5, "x", 3), ("d", 5, None, 4)], 2)
    assert table(catalog) == {1: ("a", encode_position([1]))}  # 5 was created and deleted
    assert dict(outcome.noops) == {UNKNOWN_DELETE: 1}


def test_a_key_update_is_a_delete_and_a_create_at_one_position(catalog):
    apply(catalog, [("c", 1, "a", 1)], 1)
    apply(catalog, [("d", 1, None, 7), ("c", 2, "a", 7)], 2)
    assert table(catalog) == {2: ("a", encode_position([7]))}


def test_a_replayed_entry_applies_once_and_a_redelivery_is_stale(catalog):
    items: list[Change] = [("c", 1, "a", 1), ("u", 1, "b", 2)]
    apply(catalog, items, 1)
    replay = apply(catalog, items, 1)
    assert replay.rows == 0
    assert replay.replayed == 2
    redelivered = apply(catalog, items, 2)  # a connector restart: new entry, old positions
    assert dict(redelivered.noops) == {STALE: 2}
    assert table(catalog) == {1: ("b", encode_position([2]))}
    assert len(catalog.load_table("shop.customers").scan().to_arrow()) == 1


def test_a_composite_key_is_judged_per_key(tmp_path):
    """Two key columns (a long and a string): stale and unknown-delete need both."""
    orders = with_cdc_columns([StreamConfig(
        name="lines", table="shop.lines", primary_key=("order_id", "sku"), partition="none",
        columns=(Column("order_id", "long", required=True),
                 Column("sku", "string", required=True), Column("qty", "long")),
        cdc=CdcConfig())], "test")[0]
    catalog = open_catalog(collector_config(tmp_path, streams=(orders,)).catalog)
    ensure_stream_table(catalog, orders)

    def apply_lines(items: list[tuple[str, int, str, int, int]], sequence: int):
        rows = [{"order_id": o, "sku": sku, "qty": None if op == "d" else qty,
                 "_cdc_op": op, "_cdc_position": encode_position([lsn]),
                 "_cdc_deleted": op == "d", "_event_id": f"{sequence}-{i}",
                 "_received_at": BASE, "_sequence": sequence}
                for i, (op, o, sku, qty, lsn) in enumerate(items)]
        table = pa.Table.from_pylist(rows, schema=table_arrow_schema(orders))
        return commit_table(catalog, "shop.lines", table, sequence=sequence, epoch=1,
                            clock=ManualClock(0.0), version=None, stream=orders)

    apply_lines([("c", 1, "a", 1, 10), ("c", 1, "b", 1, 11), ("c", 2, "a", 1, 12)], 1)
    outcome = apply_lines([("u", 1, "a", 5, 9), ("u", 1, "b", 7, 20), ("d", 2, "b", 0, 21),
                           ("d", 3, "a", 0, 22)], 2)
    assert dict(outcome.noops) == {STALE: 1, UNKNOWN_DELETE: 2}
    rows = catalog.load_table("shop.lines").scan().to_arrow().to_pylist()
    assert sorted((r["order_id"], r["sku"], r["qty"]) for r in rows) == [
        (1, "a", 1), (1, "b", 7), (2, "a", 1)]


def test_kept_deletes_hold_their_position_so_an_older_change_after_them_is_stale(tmp_path):
    """``deletes = "keep"``: a delete stays as its key's row (``_cdc_deleted`` true), so a
    change older than it, committed later (a re-delivery past the dedup window, another
    manifest shard), is a no-op instead of bringing the row back."""
    kept = msgspec.structs.replace(
        CUSTOMERS, cdc=CdcConfig(before_columns=("email",), deletes="keep"))
    catalog = open_catalog(collector_config(tmp_path, streams=(kept,)).catalog)
    ensure_stream_table(catalog, kept)

    def run(items: list[Change], sequence: int):
        return commit_table(catalog, "shop.customers", changes(items, sequence),
                            sequence=sequence, epoch=1, clock=ManualClock(0.0), version=None,
                            stream=kept)

    run([("c", 1, "a", 1), ("c", 2, "b", 2)], 1)
    run([("d", 1, None, 5)], 2)
    late = run([("u", 1, "late", 3), ("d", 7, None, 6)], 3)
    # the delete of 7, a key the table never held (its create travels through another
    # shard), is kept too: its position is what makes that older create stale
    assert dict(late.noops) == {STALE: 1}
    rows = {r["id"]: r for r in catalog.load_table("shop.customers").scan().to_arrow()
            .to_pylist()}
    assert sorted(rows) == [1, 2, 7]
    assert (rows[7]["_cdc_deleted"], rows[7]["_cdc_position"]) == (True, encode_position([6]))
    older = run([("c", 7, "older", 4)], 4)
    assert dict(older.noops) == {STALE: 1}
    rows = {r["id"]: r for r in catalog.load_table("shop.customers").scan().to_arrow()
            .to_pylist()}
    assert rows[7]["_cdc_deleted"] is True
    assert rows[7]["email"] is None
    assert (rows[1]["_cdc_deleted"], rows[1]["_cdc_op"], rows[1]["email"]) == (True, "d", None)
    assert rows[1]["_cdc_position"] == encode_position([5])
    again = run([("c", 1, "back", 8)], 5)
    assert again.noops == ()
    assert table(catalog)[1] == ("back", encode_position([8]))
