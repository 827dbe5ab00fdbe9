"""The admin API and change streams (#42): ``cdc`` on a sink is refused by name (400
naming the field), never dropped; change streams are declared in icefloe.toml only."""

from __future__ import annotations

import pytest

from tests.app.test_admin_api import ADMIN_TOKEN, Admin, admin  # noqa: F401  (the served API)

SINK = {"name": "people", "table": "crm.people",
        "columns": [{"name": "id", "type": "long", "required": True}],
        "primary_key": ["id"], "cdc": {"format": "debezium"}}


def test_cdc_on_a_sink_is_refused_by_name(admin: Admin) -> None:  # noqa: F811
    refused = admin.client.post("/v1/sources/clicks/sinks", json=SINK)
    assert refused.status_code == 400, refused.text
    [detail] = refused.json()["details"]
    assert detail["field"] == "sink.cdc"
    assert "icefloe.toml only" in detail["reason"]
    source = admin.client.post("/v1/sources", json={"id": "changes", "sinks": [SINK]})
    assert source.status_code == 400, source.text
    assert source.json()["details"][0]["field"] == "sinks[0].cdc"
    plain = {k: v for k, v in SINK.items() if k != "cdc"}
    created = admin.client.post("/v1/sources/clicks/sinks", json=plain)
    assert admin.task(created)["state"] == "succeeded"
    patched = admin.client.patch("/v1/sources/clicks/sinks/people", json={"cdc": {}})
    assert patched.status_code == 400, patched.text
    assert patched.json()["details"][0]["field"] == "sink.cdc"


async def test_a_seeded_registry_keeps_a_change_streams_settings(tmp_path) -> None:
    """icefloe.toml's change stream seeds the registry with its ``cdc`` (and its columns):
    the ingestor's union stream and the collector's sink stream both still apply changes."""
    from icefloe.config import Column, StreamConfig  # why: only this test needs them
    from icefloe.registry import RegistryStore
    from icefloe.registry.streams import routing_streams, source_streams
    from icefloe.store import open_async_store
    from icefloe.streams.cdc import DELETED_COLUMN, with_cdc_columns
    from icefloe.streams.model import CdcConfig

    stream = with_cdc_columns([StreamConfig(
        name="people", table="crm.people", primary_key=("id",),
        columns=(Column("id", "long", required=True),), cdc=CdcConfig())], "test")[0]
    store = open_async_store((tmp_path / "store").as_uri())
    try:
        registry = await RegistryStore(store).seed([stream], "icefloe.toml")
    finally:
        await store.close()
    for seen in (source_streams(registry)[0], routing_streams(registry)[0]):
        assert seen.cdc == CdcConfig()
    sink = registry.sources[0].sinks[0].stream("people")
    assert (sink.cdc, sink.tombstone_field) == (CdcConfig(), DELETED_COLUMN)
    # an admin change to the seeded sink keeps what a change stream needs
    from icefloe.errors import RegistryError  # why: only this test needs it
    from icefloe.registry import ops

    kept = ops.update_sink(registry, "people", "people", ops.SinkPatch(
        columns=(*stream.columns, Column("email", "string"))))
    assert kept.sources[0].sinks[0].cdc == CdcConfig()
    for patch, field in ((ops.SinkPatch(columns=stream.columns[:1]), "sink.columns"),
                         (ops.SinkPatch(where="id > 1"), "sink.where")):
        with pytest.raises(RegistryError) as refused:
            ops.update_sink(registry, "people", "people", patch)
        assert refused.value.details[0]["field"] == field, refused.value.details
