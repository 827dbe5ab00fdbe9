"""Table layout through the admin API: a sink's ``partition_by``, ``sort_by`` and
``table_properties`` shape its table; a PATCH evolves the partition spec; bad layouts are
refused with a 400 naming the entry."""

from __future__ import annotations

from pipeline.iceberg.catalog import open_catalog
from tests.app.test_admin_api import COLUMNS, Admin, admin  # noqa: F401  (the served API)

LAYOUT = {"partition_by": ["day(_received_at)", "bucket(8, user_id)"],
          "sort_by": ["user_id", "_received_at desc"],
          "table_properties": {"write.parquet.compression-codec": "snappy"}}


def test_a_sink_layout_shapes_its_table_and_a_patch_evolves_it(admin: Admin  # noqa: F811
                                                               ) -> None:
    created = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "laid", "table": "mart.laid", "columns": COLUMNS, **LAYOUT})
    assert admin.task(created)["state"] == "succeeded"
    catalog = open_catalog(admin.config.catalog)
    table = catalog.load_table("mart.laid")
    assert [str(f.transform) for f in table.spec().fields] == ["day", "bucket[8]"]
    assert len(table.sort_order().fields) == 2
    assert table.properties["write.parquet.compression-codec"] == "snappy"
    sink = admin.client.get("/v1/sources/clicks/sinks/laid").json()["sink"]
    assert sink["partition_by"] == LAYOUT["partition_by"]

    patched = admin.client.patch("/v1/sources/clicks/sinks/laid", json={
        "partition_by": ["hour(_received_at)"]})
    assert admin.task(patched)["state"] == "succeeded"
    table = catalog.load_table("mart.laid")
    assert [str(f.transform) for f in table.spec().fields] == ["hour"]
    assert len(table.specs()) == 2


def test_bad_layouts_get_a_400_naming_the_entry(admin: Admin) -> None:  # noqa: F811
    for body, field, reason in (
            ({"partition_by": ["bucket(8, nope)"]}, "sink.partition_by[0]",
             "unknown column 'nope'"),
            ({"partition_by": ["day(user_id)"]}, "sink.partition_by[0]",
             "day does not apply to column 'user_id' of type string"),
            ({"partition_by": ["day(_received_at"]}, "sink.partition_by[0]", "cannot parse"),
            ({"sort_by": ["user_id upward"]}, "sink.sort_by[0]", "cannot parse"),
            ({"table_properties": {"icefloe.managed": "no"}}, "sink.table_properties",
             "set by icefloe itself")):
        response = admin.client.post("/v1/sources/clicks/sinks", json={
            "name": "bad", "table": "mart.bad", "columns": COLUMNS, **body})
        assert response.status_code == 400, response.text
        [detail] = response.json()["details"]
        assert detail["field"] == field
        assert reason in detail["reason"]
    patched = admin.client.patch("/v1/sources/clicks/sinks/clicks", json={
        "partition_by": ["truncate(4, _received_at)"]})
    assert patched.status_code == 400
    assert patched.json()["details"][0]["field"] == "sink.partition_by[0]"


def test_partition_next_to_partition_by_is_refused_even_the_default(admin: Admin  # noqa: F811
                                                                     ) -> None:
    """``"partition": "day"`` as sent (the default once decoded) beside ``partition_by``:
    refused naming both, in a sink create and in a source created with its sinks; nothing
    is made."""
    layout = {"partition": "day", "partition_by": ["hour(_received_at)"]}
    sink = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "both", "table": "mart.both", "columns": COLUMNS, **layout})
    assert sink.status_code == 400, sink.text
    [detail] = sink.json()["details"]
    assert detail["field"] == "sink.partition_by"
    assert "set either partition_by or sink.partition (= 'day'), not both" in detail["reason"]
    source = admin.client.post("/v1/sources", json={"id": "both", "sinks": [
        {"name": "both", "table": "mart.both", "columns": COLUMNS, **layout}]})
    assert source.status_code == 400, source.text
    assert source.json()["details"][0]["field"] == "sinks[0].partition_by"
    assert admin.client.get("/v1/sources/both").status_code == 404
