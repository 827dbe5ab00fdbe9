"""``primary_key`` and ``tombstone_field``: accepted from the file and the admin API, bad
keys refused with the stream and column named, the cluster output path refused (#28)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest
from config_support import HEADER, load_text

from icefloe.config import Column
from icefloe.errors import ConfigError, RegistryError
from icefloe.registry import ops
from icefloe.registry.model import Registry

STREAM = HEADER + textwrap.dedent("""
    [[streams]]
    name = "users"
    table = "app.users"
    columns = [
      { name = "user_id", type = "string", required = true },
      { name = "region", type = "string", required = true },
      { name = "score", type = "double", required = true },
      { name = "name", type = "string" },
      { name = "deleted", type = "boolean" },
    ]
""")


def load(tmp_path: Path, extra: str, before: str = ""):
    return load_text(tmp_path, before + STREAM + extra)


def test_should_load_a_key_and_a_tombstone(tmp_path):
    config = load(tmp_path, 'primary_key = ["user_id", "region"]\n'
                            'tombstone_field = "deleted"\n')
    stream = config.streams[0]
    assert stream.primary_key == ("user_id", "region")
    assert stream.tombstone_field == "deleted"


@pytest.mark.parametrize(("extra", "message"), [
    ('primary_key = ["nope"]\n', r"streams\[0\]\.primary_key\[0\]: 'nope' is not a declared "
                                 r"column of stream 'users'"),
    ('primary_key = ["name"]\n', r"primary_key\[0\]: column 'name' of stream 'users' must be "
                                 r"declared required"),
    ('primary_key = ["score"]\n', r"column 'score' of stream 'users' has type 'double'"),
    ('primary_key = ["user_id", "user_id"]\n', r"primary_key\[1\]: column 'user_id' is named"),
    ('tombstone_field = "deleted"\n', r"tombstone_field: 'deleted' deletes rows by key, but "
                                      r"streams\[0\]\.primary_key is not set"),
    ('primary_key = ["user_id"]\ntombstone_field = "name"\n',
     r"tombstone_field: 'name' must be a declared boolean column"),
    ('primary_key = ["user_id"]\nevent_id_field = "user_id"\n',
     r"primary_key\[0\]: column 'user_id' is also streams\[0\]\.event_id_field"),
])
def test_should_refuse_a_bad_key_naming_stream_and_column(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, extra)


def test_should_accept_upserts_on_the_cluster_output_path(tmp_path):
    """#28: the cluster output path does upserts too (tests/collector/test_cluster_upserts.py)."""
    config = load(tmp_path, 'primary_key = ["user_id"]\n',
                  before='[collector]\noutput = "cluster"\n')
    assert config.collector.output == "cluster"
    assert config.streams[0].primary_key == ("user_id",)


SINK = ops.SinkSpec(name="users", table="app.users", columns=(
    Column("user_id", "string", required=True), Column("name", "string"),
    Column("deleted", "boolean")), primary_key=("user_id",), tombstone_field="deleted")


def test_admin_should_create_a_keyed_sink_and_refuse_changing_its_key():
    registry = ops.create_source(Registry(), ops.SourceSpec(id="users", sinks=(SINK,)))
    sink = registry.source("users").sink("users")
    assert sink.primary_key == ("user_id",)
    assert sink.tombstone_field == "deleted"
    assert sink.stream("users").primary_key == ("user_id",)
    with pytest.raises(RegistryError, match="upsert key of a live table cannot change") as info:
        ops.update_sink(registry, "users", "users", ops.SinkPatch(primary_key=("name",)))
    assert info.value.status == 409
    with pytest.raises(RegistryError) as info:
        ops.update_sink(registry, "users", "users", ops.SinkPatch(tombstone_field=None))
    assert info.value.status == 409
    same = ops.update_sink(registry, "users", "users", ops.SinkPatch(primary_key=("user_id",)))
    assert same.version == registry.version  # nothing changes


def test_admin_should_refuse_a_key_on_a_nullable_column():
    bad = ops.SinkSpec(name="u", table="app.u", columns=SINK.columns, primary_key=("name",))
    with pytest.raises(RegistryError, match="must be declared required") as info:
        ops.create_source(Registry(), ops.SourceSpec(id="users", sinks=(bad,)))
    assert info.value.status == 400


def test_admin_should_accept_a_keyed_sink_on_the_cluster_output_path(tmp_path):
    from icefloe.registry import RegistryStore
    from icefloe.store import open_async_store
    from icefloe_app.api.app import AdminApi
    from icefloe_app.api.auth import AdminAuth
    from icefloe_app.api.tasks import Tasks

    async def go() -> None:
        store = open_async_store((tmp_path / "store").as_uri())
        api = AdminApi(RegistryStore(store), Tasks(lambda stream: None), AdminAuth(()),
                       pending=lambda source: asyncio.sleep(0, 0), cluster_output=True)
        after = await api.check(lambda r: ops.create_source(r, ops.SourceSpec(
            id="users", sinks=(SINK,))), "users")
        assert after.source("users").sink("users").primary_key == ("user_id",)
        await store.close()
    asyncio.run(go())
