"""Native column types through the admin API: a sink with nested types creates its table
with them; a malformed type or an illegal type change is refused naming the field."""

from __future__ import annotations

from pipeline.iceberg.catalog import open_catalog
from tests.app.test_admin_api import COLUMNS, Admin, admin  # noqa: F401  (the served API)

NESTED = [*COLUMNS, {"name": "total", "type": "decimal(9,2)"},
          {"name": "items", "type": "list<struct<sku: string, qty: int>>"}]


def test_a_sink_with_native_types_gets_them_in_its_table_and_keeps_them(
        admin: Admin) -> None:  # noqa: F811
    created = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "typed", "table": "mart.typed", "columns": NESTED})
    assert admin.task(created)["state"] == "succeeded"
    schema = open_catalog(admin.config.catalog).load_table("mart.typed").schema()
    assert str(schema.find_type("total")) == "decimal(9, 2)"
    assert str(schema.find_type("items")).startswith("list<struct<")

    bad = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "bad", "table": "mart.bad",
        "columns": [*COLUMNS, {"name": "m", "type": "map<long,string>"}]})
    assert bad.status_code == 400
    [detail] = bad.json()["details"]
    assert detail["field"] == "sink.columns[2].type"
    assert "map keys must be string" in detail["reason"]
    assert "column 'm'" in detail["reason"]

    widened = admin.client.patch("/v1/sources/clicks/sinks/typed", json={
        "columns": [*COLUMNS, {"name": "total", "type": "decimal(18,2)"},
                    {"name": "items", "type": "list<struct<sku: string, qty: int>>"}]})
    assert admin.task(widened)["state"] == "succeeded"
    rescaled = admin.client.patch("/v1/sources/clicks/sinks/typed", json={
        "columns": [*COLUMNS, {"name": "total", "type": "decimal(18,3)"}]})
    failed = admin.task(rescaled)
    assert failed["state"] == "failed"
    assert "'total'" in failed["error"]["message"]
