"""Stream keys that would be accepted and mean nothing are refused, naming them: an
``evolve_quota`` without schema evolution, a ``format = "op"`` cdc key on a Debezium
stream, ``enums`` on an Avro stream, ``subject_version`` (only the latest version is
followed), an Avro ``text`` next to its ``schema_file``, ``partition`` next to
``partition_by``. The same checks run for the admin API's sinks where they are shared."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from config_support import HEADER, load_text

from icefloe.config import Column
from icefloe.errors import ConfigError, RegistryError
from icefloe.registry.model import Sink
from icefloe.registry.ops import check_sink
from icefloe.streams.model import EvolveQuota

STREAM = HEADER + textwrap.dedent("""
    [[streams]]
    name = "s"
    table = "a.b"
    columns = [{ name = "x", type = "string" }]
""")
CHANGES = HEADER + textwrap.dedent("""
    [[streams]]
    name = "s"
    table = "a.b"
    columns = [{ name = "id", type = "long", required = true }, { name = "x", type = "string" }]
    primary_key = ["id"]
""")
AVRO = HEADER + textwrap.dedent("""
    [[streams]]
    name = "clicks"
    table = "web.clicks"
    format = "avro"
""")
CLICK = {"type": "record", "name": "Click", "namespace": "acme", "fields": [
    {"name": "user_id", "type": "string"},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}}]}


def refused(tmp_path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text)
    return str(info.value)


# -- 1. evolve_quota needs unknown_fields = "evolve" -----------------------------------------


@pytest.mark.parametrize("unknown", ["", 'unknown_fields = "ignore"\n',
                                     'unknown_fields = "reject"\n'])
def test_evolve_quota_without_evolution_is_refused_naming_both_keys(tmp_path, unknown):
    message = refused(tmp_path, STREAM + unknown + "evolve_quota = { token_columns_total = 5 }\n")
    assert "streams[0].evolve_quota:" in message
    assert "streams[0].unknown_fields" in message
    assert "evolve" in message


def test_evolve_quota_with_evolution_loads(tmp_path):
    config = load_text(tmp_path, STREAM + 'unknown_fields = "evolve"\n'
                       "evolve_quota = { token_columns_total = 5 }\n")
    assert config.streams[0].evolve_quota == EvolveQuota(token_columns_total=5)


def test_an_admin_api_sink_with_evolve_quota_and_no_evolution_is_refused():
    sink = Sink(name="b", table="a.b", columns=(Column("x", "string"),),
                evolve_quota=EvolveQuota(token_columns_total=5))
    with pytest.raises(RegistryError) as info:
        check_sink("s", sink, "sink")
    assert info.value.status == 400
    assert "sink.evolve_quota" in str(info.value)
    assert "sink.unknown_fields" in str(info.value)


# -- 2. format = "op" keys on a Debezium stream -------------------------------------------


@pytest.mark.parametrize(("cdc", "key"), [
    ('{ op_field = "kind" }', "op_field"),
    ('{ format = "debezium", op_field = "kind" }', "op_field"),
    ('{ ops = { X = "c" } }', "ops"),
    ('{ before_field = "old" }', "before_field"),
    ('{ before_field = "" }', "before_field"),
])
def test_op_format_keys_are_refused_for_debezium(tmp_path, cdc, key):
    message = refused(tmp_path, CHANGES + f"cdc = {cdc}\n")
    assert f"streams[0].cdc.{key}: only for format = \"op\"" in message


def test_op_field_is_taken_by_the_op_format(tmp_path):
    stream = load_text(tmp_path, CHANGES + 'cdc = { format = "op", op_field = "kind", '
                       'position = ["$.seq"] }\n').streams[0]
    assert stream.cdc is not None
    assert stream.cdc.op_field == "kind"
    debezium = load_text(tmp_path, CHANGES + 'cdc = { op_field = "op" }\n').streams[0]
    assert debezium.cdc is not None
    assert debezium.cdc.op_field == "op"  # Debezium's own


# -- 3. enums is Protobuf's ------------------------------------------------------------------


def test_avro_enums_int_is_refused_naming_the_key_and_the_supported_value(tmp_path):
    (tmp_path / "click.avsc").write_text(json.dumps(CLICK))
    message = refused(tmp_path, AVRO + 'schema = { schema_file = "click.avsc", enums = "int" }\n')
    assert "`enums`" in message
    assert "'int'" in message
    assert 'enums = "string"' in message
    stream = load_text(tmp_path, AVRO + 'schema = { schema_file = "click.avsc", '
                       'enums = "string" }\n').streams[0]
    assert {c.name: c.type for c in stream.columns}["kind"] == "string"


def test_avro_subject_stream_enums_int_is_refused(tmp_path):
    message = refused(tmp_path, AVRO + 'schema = { subject = "c-value", enums = "int" }\n')
    assert "`enums`" in message


# -- 4. subject_version: only the latest version is followed -----------------------------


@pytest.mark.parametrize("schema", [
    '{ subject = "o-value", subject_version = 3 }',
    '{ schema_file = "click.avsc", subject_version = 3 }',
])
def test_subject_version_is_refused_saying_only_the_latest_is_followed(tmp_path, schema):
    (tmp_path / "click.avsc").write_text(json.dumps(CLICK))
    message = refused(tmp_path, AVRO + f"schema = {schema}\n")
    assert "`subject_version`" in message
    assert "latest version" in message


def test_protobuf_subject_version_is_refused(tmp_path):
    message = refused(tmp_path, HEADER + textwrap.dedent("""
        [[streams]]
        name = "orders"
        table = "shop.orders"
        format = "protobuf"
        schema = { subject = "o-value", message = "acme.O", subject_version = 3 }
    """))
    assert "`subject_version`" in message


# -- 5. a schema's text and its file ---------------------------------------------------------


def test_avro_text_next_to_a_schema_file_is_refused(tmp_path):
    (tmp_path / "click.avsc").write_text(json.dumps(CLICK))
    text = json.dumps(json.dumps({**CLICK, "fields": CLICK["fields"][:1]}))
    message = refused(tmp_path, AVRO + f'schema = {{ schema_file = "click.avsc", '
                                     f'text = {text} }}\n')
    assert "`schema_file`" in message
    assert "`text`" in message
    assert "not both" in message
    alone = load_text(tmp_path, AVRO + f"schema = {{ text = {text} }}\n").streams[0]
    assert [c.name for c in alone.columns] == ["user_id"]


def test_protobuf_text_next_to_a_descriptor_set_is_refused(tmp_path):
    message = refused(tmp_path, HEADER + textwrap.dedent("""
        [[streams]]
        name = "orders"
        table = "shop.orders"
        format = "protobuf"
        schema = { message = "acme.O", descriptor_set = "o.binpb", text = "AAAA" }
    """))
    assert "`descriptor_set`" in message
    assert "`text`" in message
    assert "not both" in message


# -- 6. partition and partition_by -----------------------------------------------------------


@pytest.mark.parametrize("partition", ["day", "hour", "month", "none"])
def test_partition_next_to_partition_by_is_refused_naming_both(tmp_path, partition):
    message = refused(tmp_path, STREAM + f'partition = "{partition}"\n'
                      'partition_by = ["identity(x)"]\n')
    path = str(tmp_path / "icefloe.toml")
    assert message.count(path) == 1, message  # the file once, at the front
    assert re.search(r"streams\[0\]\.partition_by: set either partition_by or "
                     rf"streams\[0\]\.partition \(= '{partition}'\), not both", message)
    assert "none(" not in message
    if partition == "none":
        assert "partition_by = [] says the same" in message
    else:
        assert f'partition_by = ["{partition}(_received_at)"] says the same' in message


def test_partition_by_alone_loads(tmp_path):
    stream = load_text(tmp_path, STREAM + 'partition_by = ["identity(x)"]\n').streams[0]
    assert stream.partition_by == ("identity(x)",)


def test_an_admin_api_sink_with_partition_none_and_partition_by_reads_well():
    sink = Sink(name="b", table="a.b", columns=(Column("x", "string"),), partition="none",
                partition_by=("identity(x)",))
    with pytest.raises(RegistryError) as info:
        check_sink("s", sink, "sink")
    assert "set either partition_by or sink.partition (= 'none'), not both" in str(info.value)
    assert "none(" not in str(info.value)
