"""icefloe.toml loading: the documented shape, precedence, paths and precise errors."""

from __future__ import annotations

import re
import textwrap

import pytest
from config_support import HEADER
from config_support import write_config as write

from icefloe.config import load_config
from icefloe.errors import ConfigError

MINIMAL = HEADER + textwrap.dedent("""
    [[streams]]
    name = "pageviews"
    table = "web.pageviews"
    columns = [
      { name = "user_id", type = "string", required = true },
      { name = "url", type = "string" },
      { name = "duration_ms", type = "long" },
      { name = "ts", type = "timestamp" },
    ]
""")


def test_should_load_the_documented_minimal_shape(tmp_path):
    config = load_config(write(tmp_path, MINIMAL), env={})
    assert config.store.url == "file:///var/lib/icefloe/store"
    assert config.catalog.uri == "sqlite:////var/lib/icefloe/catalog.db"
    stream = config.stream("pageviews")
    assert stream is not None
    assert (stream.namespace, stream.table_name) == ("web", "pageviews")
    assert [c.type for c in stream.columns] == ["string", "string", "long", "timestamp"]
    assert stream.columns[0].required
    assert stream.unknown_fields == "ignore"
    assert config.ingestor.http_port == 8080
    assert config.ingestor.grpc_port == 50051


def test_should_apply_flag_over_env_over_file(tmp_path):
    path = write(tmp_path, MINIMAL + "[ingestor]\nhttp_port = 9000\ngrpc_port = 9001\n")
    env = {"ICEFLOE_INGESTOR_HTTP_PORT": "9100", "ICEFLOE_INGESTOR_GRPC_PORT": "9101"}
    config = load_config(path, env=env, overrides={"ingestor": {"http_port": 9200,
                                                                "grpc_port": None}})
    assert config.ingestor.http_port == 9200  # flag wins
    assert config.ingestor.grpc_port == 9101  # env beats the file


def test_should_find_the_config_through_the_environment(tmp_path):
    path = write(tmp_path, MINIMAL)
    config = load_config(None, env={"ICEFLOE_CONFIG": str(path)})
    assert config.source == str(path)


def test_should_resolve_relative_paths_against_the_config_folder(tmp_path):
    text = MINIMAL.replace("file:///var/lib/icefloe/store", "file://data/store")
    text = text.replace("sqlite:////var/lib/icefloe/catalog.db", "sqlite:///data/catalog.db")
    config = load_config(write(tmp_path, text), env={})
    assert config.store.url == (tmp_path / "data" / "store").resolve().as_uri()
    assert config.catalog.uri == f"sqlite:///{(tmp_path / 'data' / 'catalog.db').resolve()}"


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.replace('type = "long"', 'type = "lnog"'),
     r"streams\[0\]\.columns\[2\]\.type: unknown type 'lnog'"),
    (lambda t: t + "[ingestor]\nhttp_port = 'eighty'\n",
     r"ingestor\.http_port: Expected `int`"),
    (lambda t: t + "[ingestor]\nhtp_port = 1\n", r"unknown field `htp_port`"),
    (lambda t: t.replace('table = "web.pageviews"', 'table = "pageviews"'),
     r"streams\[0\]\.table: 'pageviews' must be 'namespace.table'"),
    (lambda t: t + "[manifest]\ngc_grace_s = 60\n", r"manifest\.gc_grace_s \(60\)"),
    (lambda t: t + t[t.index("[[streams]]"):], r"streams\[1\]\.name: duplicate stream"),
    (lambda t: t.replace('name = "url"', 'name = "_event_id"'), r"reserved by icefloe"),
    (lambda t: t + "[ingestor]\nhttp_port = 70000\n", r"70000 is not a TCP port"),
    (lambda t: t.replace("[[streams]]", "[[streams]\n"), r"invalid TOML"),
    (lambda t: t.replace('name = "pageviews"', 'name = "pageviews"\nevent_id_field = "id"'),
     r"event_id_field: 'id' is not a declared column"),
])
def test_should_name_file_key_and_reason_for_bad_config(tmp_path, change, message):
    path = write(tmp_path, change(MINIMAL))
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path, env={})
    assert str(path) in str(info.value)


def test_should_report_a_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml", env={})


@pytest.mark.parametrize("key", ["min_flush_interval_ms", "early_flush_requests"])
def test_should_refuse_a_negative_flush_trigger(tmp_path, key):
    path = write(tmp_path, MINIMAL + f"[ingestor]\n{key} = -1\n")
    with pytest.raises(ConfigError, match=rf"ingestor.{key} must be >= 0"):
        load_config(path, env={})


def test_should_take_the_early_flush_threshold_from_the_environment(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert load_config(path, env={}).ingestor.early_flush_requests == 64
    config = load_config(path, env={"ICEFLOE_INGESTOR_EARLY_FLUSH_REQUESTS": "0"})
    assert config.ingestor.early_flush_requests == 0


def test_should_refuse_a_buffer_smaller_than_one_request(tmp_path):
    path = write(tmp_path, MINIMAL + "[ingestor]\nbuffer_max_bytes = 1000\nmax_body_bytes = 2000\n"
                 "flush_bytes = 500\n")
    with pytest.raises(ConfigError, match=r"buffer_max_bytes \(1000\) must be >= "
                                          r"ingestor.max_body_bytes \(2000\)"):
        load_config(path, env={})


# --- settings that rest on each other: refused at start, naming both keys ---------------

PAIRS = [
    ("[ingestor]\nflush_timeout_s = 30\n[manifest]\nappend_deadline_s = 30\n",
     r"ingestor\.flush_timeout_s \(30\) must be less than manifest\.append_deadline_s \(30\)"),
    ("[admin]\ntombstone_grace_s = 400\n",
     r"admin\.tombstone_grace_s \(400\) must be at least manifest\.append_deadline_s \(120\)"
     r" \+ ingestor\.flush_timeout_s \(30\) \+ admin\.registry_poll_s \(2\) \+ 300 s = 452"),
    ("[collector]\nsnapshot_max_age_s = 300\ndedup_window_s = 600\n",
     r"collector\.snapshot_max_age_s \(300\) must be at least collector\.dedup_window_s "
     r"\(600\)"),
    ("[ingestor]\nflush_age_ms = 100\nmin_flush_interval_ms = 300\n",
     r"ingestor\.flush_age_ms \(100\) must be at least ingestor\.min_flush_interval_ms "
     r"\(300\)"),
]


@pytest.mark.parametrize(("extra", "message"), PAIRS)
def test_should_refuse_settings_that_break_each_others_assumptions(tmp_path, extra, message):
    path = write(tmp_path, MINIMAL + extra)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path, env={})
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("extra", "message"), PAIRS)
def test_should_exit_2_naming_both_keys_for_a_broken_pair(tmp_path, capsys, extra, message):
    from icefloe_app.cli import main

    path = write(tmp_path, MINIMAL + extra)
    assert main(["streams", "list", "--config", str(path)]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("extra", [
    "[ingestor]\nflush_timeout_s = 29.9\n[manifest]\nappend_deadline_s = 30\n",
    "[admin]\ntombstone_grace_s = 452\n",
    "[collector]\nsnapshot_max_age_s = 600\ndedup_window_s = 600\n",
    "[collector]\nsnapshot_max_age_s = 60\ndedup_window_s = 0\n",  # dedup off: no need
    "[ingestor]\nflush_age_ms = 300\nmin_flush_interval_ms = 300\n",
])
def test_should_accept_pairs_on_the_safe_side_of_their_bound(tmp_path, extra):
    load_config(write(tmp_path, MINIMAL + extra), env={})


def test_should_accept_the_defaults_and_the_shipped_example():
    from pathlib import Path

    from icefloe.config import Config, validate

    validate(Config(), "defaults")
    load_config(Path(__file__).resolve().parents[2] / "examples" / "icefloe.toml", env={})


def test_should_refuse_snapshots_expiring_before_the_dedup_window(tmp_path):
    """The dedup window is rebuilt from the snapshots of its commits (issue #22)."""
    path = write(tmp_path, MINIMAL + "[collector]\ndedup_window_s = 900\n")
    with pytest.raises(ConfigError, match=r"collector.snapshot_max_age_s \(600\) must be at "
                                          r"least collector.dedup_window_s \(900\)"):
        load_config(path, env={})
    path = write(tmp_path, MINIMAL + "[collector]\ndedup_window_s = 900\n"
                 "snapshot_max_age_s = 900\n")
    assert load_config(path, env={}).collector.snapshot_max_age_s == 900


@pytest.mark.parametrize(("where", "problem"), [
    ("(" * 60 + "duration_ms > 1" + ")" * 60, "nests deeper than 32 levels"),
    ("duration_ms IN (" + ", ".join(str(i) for i in range(1001)) + ")",
     "an IN list holds 1001 values; a where allows at most 1000"),
])
def test_should_refuse_a_where_beyond_its_limits_at_load(tmp_path, where, problem):
    """#36: the where limits hold for icefloe.toml too, named with the key and the sink
    (a deep one was a RecursionError before)."""
    text = MINIMAL.replace('name = "pageviews"\n', f'name = "pageviews"\nwhere = "{where}"\n',
                           1)
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert "streams[0].where" in str(info.value)
    assert problem in str(info.value)
