"""``[otlp]``: the streams it generates for every role, and the refusals that name the key."""

from __future__ import annotations

import textwrap

import pytest
from config_support import HEADER, load_text

from icefloe.config import load_config
from icefloe.config.reference import rows
from icefloe.errors import ConfigError
from icefloe.otlp.config import DEFAULT_TABLES, OtlpSection, otlp_stream_names
from icefloe.otlp.kinds import KINDS, SIGNAL_KINDS
from icefloe.otlp.schemas import COLUMNS
from icefloe.streams.layout import partition_fields
from icefloe.tokens import hash_token

TOKEN_HASH = hash_token("otlp-token", log2_n=10)


def otlp(body: str, streams: str = "") -> str:
    return HEADER + textwrap.dedent(streams) + "[otlp]\n" + textwrap.dedent(body)


def test_should_generate_one_json_stream_per_kind_with_day_and_service_bucket(tmp_path):
    config = load_text(tmp_path, otlp("enabled = true\n"))
    assert [s.name for s in config.streams] == [f"otlp.{kind}" for kind in KINDS]
    assert {s.table for s in config.streams} == set(DEFAULT_TABLES.values())
    assert config.stream("otlp.logs").table == "otel.logs"
    assert config.stream("otlp.exponential_histogram").table == "otel.metrics_exp_histogram"
    spans = config.stream("otlp.spans")
    assert spans.format == "json"
    assert spans.event_id_field is None
    assert spans.partition_by == ("day(start_time)", "bucket(16, service_name)")
    assert config.stream("otlp.gauge").partition_by == ("day(time)",
                                                          "bucket(16, service_name)")
    assert [(f.transform, f.column, f.param) for f in partition_fields(spans)] == [
        ("day", "start_time", None), ("bucket", "service_name", 16)]
    for stream in config.streams:
        kind = stream.name.removeprefix("otlp.")
        assert stream.columns == COLUMNS[kind]
    assert otlp_stream_names(config.otlp) == {k: f"otlp.{k}" for k in KINDS}


def test_should_generate_nothing_when_off_and_keep_declared_streams_first(tmp_path):
    assert load_text(tmp_path, HEADER).streams == ()
    assert load_text(tmp_path, otlp("enabled = false\n")).streams == ()
    assert otlp_stream_names(OtlpSection()) == {}
    declared = """
        [[streams]]
        name = "web"
        table = "web.events"
        columns = [{ name = "url", type = "string" }]
    """
    config = load_text(tmp_path, otlp("enabled = true\nkinds = [\"logs\", \"spans\"]\n",
                                      declared))
    assert [s.name for s in config.streams] == ["web", "otlp.logs", "otlp.spans"]


def test_should_take_tables_buckets_layout_tokens_and_limits(tmp_path):
    config = load_text(tmp_path, otlp(f"""
        enabled = true
        kinds = ["logs", "spans", "sum"]
        logs_table = "obs.log_records"
        service_buckets = 64
        tokens = ["{TOKEN_HASH}"]
        table_properties = {{ "write.parquet.compression-codec" = "zstd" }}
        rate_limit = {{ events_per_s = 1000 }}
        [otlp.partition_by]
        spans = ["hour(start_time)", "bucket(8, trace_id)"]
        [otlp.sort_by]
        logs = ["service_name", "time"]
    """))
    logs, spans, sums = config.streams
    assert logs.table == "obs.log_records"
    assert logs.partition_by == ("day(time)", "bucket(64, service_name)")
    assert logs.sort_by == ("service_name", "time")
    assert spans.partition_by == ("hour(start_time)", "bucket(8, trace_id)")
    assert sums.name == "otlp.sum"
    assert sums.table == "otel.metrics_sum"
    for stream in config.streams:
        assert stream.tokens == (TOKEN_HASH,)
        assert stream.table_properties == {"write.parquet.compression-codec": "zstd"}
        assert stream.rate_limit is not None
        assert stream.rate_limit.events_per_s == 1000


def test_should_let_tokens_entries_name_the_generated_streams(tmp_path):
    config = load_text(tmp_path, otlp("enabled = true\n", f"""
        [[tokens]]
        name = "logs-only"
        hash = "{TOKEN_HASH}"
        streams = ["otlp.logs"]
    """))
    assert config.tokens[0].streams == ("otlp.logs",)


def test_should_read_the_environment(tmp_path):
    path = tmp_path / "icefloe.toml"
    path.write_text(HEADER)
    config = load_config(path, env={"ICEFLOE_OTLP_ENABLED": "true",
                                    "ICEFLOE_OTLP_KINDS": "logs,gauge",
                                    "ICEFLOE_OTLP_SERVICE_BUCKETS": "4"})
    assert [s.name for s in config.streams] == ["otlp.logs", "otlp.gauge"]
    assert config.streams[1].partition_by == ("day(time)", "bucket(4, service_name)")


@pytest.mark.parametrize(("body", "streams", "message"), [
    ("enabled = true\nkinds = [\"logs\", \"traces\"]\n", "",
     "otlp.kinds: unknown kind 'traces' (expected one of logs, spans, gauge"),
    ("enabled = true\nkinds = [\"logs\", \"logs\"]\n", "", "otlp.kinds: a kind is listed twice"),
    ("enabled = true\nkinds = []\n", "", "otlp.kinds: empty"),
    ("enabled = true\nservice_buckets = 0\n", "", "otlp.service_buckets: 0 must be between"),
    ("enabled = true\nservice_buckets = 5000\n", "", "otlp.service_buckets: 5000"),
    ("enabled = true\nsum_table = \"otel.logs\"\n", "",
     "otlp.sum_table: 'otel.logs' is also otlp.logs_table"),
    ("enabled = true\n[otlp.partition_by]\nmetrics = [\"day(time)\"]\n", "",
     "otlp.partition_by: unknown kind 'metrics'"),
    ("enabled = true\nkinds = [\"logs\"]\n[otlp.sort_by]\nspans = [\"name\"]\n", "",
     "otlp.sort_by.spans: spans is not in otlp.kinds"),
    ("enabled = true\n[otlp.partition_by]\nspans = [\"day(time)\"]\n", "",
     "otlp.spans.partition_by[0]: "),
    ("enabled = true\nlogs_table = \"Otel-Logs\"\n", "", "otlp.logs.table: 'Otel-Logs'"),
    ("enabled = true\ntokens = [\"plain-secret\"]\n", "", "otlp.tokens[0]"),
    ("enabled = true\ntraces_table = \"otel.traces\"\n", "", "traces_table"),
    ("enabled = true\n", """
        [[streams]]
        name = "otlp.logs"
        table = "app.logs"
        columns = [{ name = "msg", type = "string" }]
     """, "streams[0].name: 'otlp.logs' is the stream [otlp] generates for logs rows"),
    ("enabled = true\n", """
        [[streams]]
        name = "app"
        table = "otel.spans"
        columns = [{ name = "msg", type = "string" }]
     """, "streams[0].table: 'otel.spans' is otlp.spans_table"),
    ("enabled = true\n", """
        [[tokens]]
        name = "metrics"
        hash = "HASH"
        streams = ["otlp.metrics"]
     """, "'otlp.metrics'"),
])
def test_should_refuse_naming_the_key(tmp_path, body, streams, message):
    text = otlp(body, streams.replace("HASH", TOKEN_HASH))
    with pytest.raises(ConfigError) as caught:
        load_text(tmp_path, text)
    assert message in str(caught.value)


def test_should_check_kinds_even_when_off(tmp_path):
    with pytest.raises(ConfigError, match=r"otlp\.kinds: unknown kind 'log'"):
        load_text(tmp_path, otlp("kinds = [\"log\"]\n"))


def test_should_list_every_key_in_the_reference():
    keys = {row[0] for row in rows()}
    for field in OtlpSection.__struct_fields__:
        assert f"`otlp.{field}`" in keys
    meanings = {row[0]: row[3] for row in rows()}
    assert all(meanings[f"`otlp.{field}`"] for field in OtlpSection.__struct_fields__)


def test_should_cover_every_signal_with_kinds():
    assert sorted(k for kinds in SIGNAL_KINDS.values() for k in kinds) == sorted(KINDS)
    assert set(COLUMNS) == set(KINDS) == set(DEFAULT_TABLES)
