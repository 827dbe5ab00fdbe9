"""Bad configs the loader must refuse in one line naming the key or the variable: NaN and
infinities, wrong types in the file, environment values that are not exactly their type,
``ICEFLOE_*`` names that set nothing, and settings that contradict each other."""

from __future__ import annotations

import pytest
from config_support import HEADER, write_config

from icefloe.config import load_config
from icefloe.errors import ConfigError


def refused(tmp_path, text: str = "", env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path, HEADER + text), env=env or {})
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(("section", "key"), [
    ("ingestor", "flush_timeout_s"), ("ingestor", "body_max_s"),
    ("manifest", "append_deadline_s"), ("manifest", "gc_grace_s"),
    ("admin", "tombstone_grace_s"), ("collector", "commit_interval_s"),
    ("collector", "snapshot_max_age_s"), ("collector", "dedup_window_s")])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_should_refuse_nan_and_infinity_for_every_float_setting(tmp_path, section, key, value):
    message = refused(tmp_path, f"[{section}]\n{key} = {value}\n")
    assert f"{section}.{key}: " in message
    assert "not a finite number" in message


def test_should_refuse_nan_in_a_stream_table_too(tmp_path):
    text = ('[[streams]]\nname = "a"\ntable = "w.a"\ncolumns = [{ name = "x", type = "string" }]'
            "\nrate_limit = { events_per_s = nan }\n")
    assert "streams[0].rate_limit.events_per_s: nan is not a finite" in refused(tmp_path, text)


@pytest.mark.parametrize("value", ["nan", "inf", "Infinity"])
def test_should_refuse_nan_from_the_environment_by_name(tmp_path, value):
    message = refused(tmp_path, env={"ICEFLOE_INGESTOR_FLUSH_TIMEOUT_S": value})
    assert message.startswith(f"ICEFLOE_INGESTOR_FLUSH_TIMEOUT_S={value!r}: ")
    assert "finite number" in message


@pytest.mark.parametrize(("text", "key"), [
    ('[ingestor]\nhttp_port = "8080"', "ingestor.http_port: Expected `int`, got `str`"),
    ("[ingestor]\nhttp_port = 8080.0", "ingestor.http_port: Expected `int`, got `float`"),
    ('[ingestor]\nplaintext = "true"', "ingestor.plaintext: Expected `bool`, got `str`"),
    ("[ingestor]\nplaintext = 1", "ingestor.plaintext: Expected `bool`, got `int`"),
    ('[manifest]\nmax_entries = "20000"', "manifest.max_entries: Expected `int`"),
    ('[[streams]]\nname = "a"\ntable = "w.a"\n'
     'columns = [{ name = "x", type = "string", required = "true" }]',
     "streams[0].columns[0].required: Expected `bool`, got `str`"),
])
def test_should_refuse_a_wrong_type_in_the_file(tmp_path, text, key):
    message = refused(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'icefloe.toml'}: {key}")
    assert ";" in message  # and says what to write instead


def test_should_still_take_an_int_for_a_float_in_the_file(tmp_path):
    config = load_config(write_config(tmp_path, HEADER + "[ingestor]\nflush_timeout_s = 5\n"),
                         env={})
    assert config.ingestor.flush_timeout_s == 5.0


@pytest.mark.parametrize(("name", "value", "words"), [
    ("ICEFLOE_MANIFEST_MAX_ENTRIES", "1e3", "manifest.max_entries takes a whole number"),
    ("ICEFLOE_INGESTOR_HTTP_PORT", "8080.0", "ingestor.http_port takes a whole number"),
    ("ICEFLOE_INGESTOR_HTTP_PORT", " 8080", "ingestor.http_port takes a whole number"),
    ("ICEFLOE_INGESTOR_HTTP_PORT", "٨٠٨٠", "ingestor.http_port takes a whole number"),
    ("ICEFLOE_INGESTOR_KAFKA_PORT", "off", "or null to unset it"),
    ("ICEFLOE_INGESTOR_PLAINTEXT", "yes", "ingestor.plaintext takes true or false (or 1 or 0)"),
    ("ICEFLOE_COLLECTOR_OVERLAP", "on", "collector.overlap takes true or false"),
    ("ICEFLOE_INGESTOR_FLUSH_TIMEOUT_S", "1_0", "ingestor.flush_timeout_s takes a finite"),
    ("ICEFLOE_CATALOG_TYPE", "hive", "(for catalog.type)"),
])
def test_should_refuse_an_environment_value_naming_the_variable(tmp_path, name, value, words):
    message = refused(tmp_path, env={name: value})
    assert message.startswith(f"{name}={value!r}: ")
    assert words in message
    assert "icefloe.toml" not in message


def test_should_parse_environment_values_by_their_type(tmp_path):
    env = {"ICEFLOE_INGESTOR_PLAINTEXT": "1", "ICEFLOE_INGESTOR_REUSE_PORT": "TRUE",
           "ICEFLOE_COLLECTOR_OVERLAP": "0", "ICEFLOE_INGESTOR_HTTP_PORT": "9000",
           "ICEFLOE_INGESTOR_KAFKA_PORT": "null", "ICEFLOE_INGESTOR_FLUSH_TIMEOUT_S": "1e1",
           "ICEFLOE_MANIFEST_APPEND_DEADLINE_S": "60", "ICEFLOE_OTLP_KINDS": "logs, spans"}
    config = load_config(write_config(tmp_path, HEADER + "[ingestor]\nkafka_port = 9092\n"),
                         env=env)
    assert (config.ingestor.plaintext, config.ingestor.reuse_port) == (True, True)
    assert config.collector.overlap is False
    assert (config.ingestor.http_port, config.ingestor.kafka_port) == (9000, None)
    assert config.ingestor.flush_timeout_s == 10.0
    assert config.otlp.kinds == ("logs", "spans")


def test_should_blame_the_variable_for_a_value_validation_refuses(tmp_path):
    message = refused(tmp_path, env={"ICEFLOE_INGESTOR_HTTP_PORT": "70000"})
    assert "ingestor.http_port: 70000 is not a TCP port" in message
    assert "ICEFLOE_INGESTOR_HTTP_PORT='70000' in the environment" in message


def test_should_name_collect_port_when_the_admin_port_it_derives_is_no_port(tmp_path):
    message = refused(tmp_path, env={"COLLECT_PORT": "65535"})
    assert message.startswith("COLLECT_PORT=65535: ")
    assert "COLLECT_ADMIN_PORT" in message
    assert load_config(write_config(tmp_path, HEADER),
                       env={"COLLECT_PORT": "65535",
                            "COLLECT_ADMIN_PORT": "9000"}).admin.port == 9000


@pytest.mark.parametrize("value", ["²", "8080.0", "-1"])
def test_should_refuse_a_collect_port_that_is_not_ascii_digits(tmp_path, value):
    assert refused(tmp_path, env={"COLLECT_PORT": value}).startswith(
        f"COLLECT_PORT: {value!r} is not a port number")


@pytest.mark.parametrize(("name", "words"), [
    ("ICEFLOE_INGESTOR_HTTPPORT", "did you mean ICEFLOE_INGESTOR_HTTP_PORT?"),
    ("ICEFLOE_INGESTOR_http_port", "did you mean ICEFLOE_INGESTOR_HTTP_PORT?"),
    ("ICEFLOE_INGESTER_HTTP_PORT", "did you mean ICEFLOE_INGESTOR_HTTP_PORT?"),
    ("ICEFLOE_COLECTOR_METRICS_PORT", "did you mean ICEFLOE_COLLECTOR_METRICS_PORT?"),
    ("ICEFLOE_ADMIN_NOTHING_LIKE_IT", "[admin] has no setting 'nothing_like_it'"),
    ("ICEFLOE_CATALOG_PROPERTIES", "catalog.properties is a table"),
    ("ICEFLOE_COLLECTOR_SPARK_CONF", "collector.spark_conf is a table"),
    ("ICEFLOE_INGESTOR_CLIENT_RATE_LIMIT", "ingestor.client_rate_limit is a table"),
    ("ICEFLOE_OTLP_PARTITION_BY", "otlp.partition_by is a table"),
])
def test_should_refuse_an_icefloe_variable_that_sets_nothing(tmp_path, name, words):
    message = refused(tmp_path, env={name: "1"})
    assert message.startswith(f"{name}: ")
    assert words in message


def test_should_leave_variables_other_parts_read_alone(tmp_path):
    names = ("ICEFLOE_DATA_DIR", "ICEFLOE_ADMIN_TOKEN", "ICEFLOE_ADMIN_CACERT",
             "ICEFLOE_COLLECTOR_URL", "ICEFLOE_STORE_FAULTS", "ICEFLOE_SPEEDUPS",
             "ICEFLOE_TOKEN", "ICEFLOE_HEALTHCHECK_CERT_FILE", "ICEFLOE_HEALTHCHECK_KEY_FILE",
             "ICEFLOE_BUF_DIR", "ICEFLOE_CHECKOV", "ICEFLOE_DUCKDB_ICEBERG_PYTHON",
             "ICEFLOE_ICEBERG_JAVA_PYTHON", "ICEFLOE_SOMETHING_ELSE", "ICEFLOE_",
             "ICEFLOE_CATALOG", "ICEFLOE_INGESTORS")
    load_config(write_config(tmp_path, HEADER), env=dict.fromkeys(names, "x"))


def test_should_name_a_config_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "icefloe.toml"
    path.write_bytes(HEADER.encode() + b"# caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert str(caught.value).startswith(f"{path}: not UTF-8 text")


def test_should_refuse_admin_plaintext_with_tls(tmp_path):
    text = '[admin]\nplaintext = true\ntls_cert_file = "a.pem"\ntls_key_file = "a.key"\n'
    assert "admin.plaintext: true contradicts admin.tls_cert_file" in refused(tmp_path, text)


@pytest.mark.parametrize(("text", "words"), [
    ('[manifest]\nkey = ""', "manifest.key: '' must be a relative object key"),
    ('[manifest]\nkey = "/manifest/queue"', "manifest.key: '/manifest/queue' must be a relative"),
    ('[manifest]\nkey = "registry/registry.json"', "manifest.key ('registry/registry.json') "
                                                  "and admin.registry_key"),
    ('[manifest]\nkey = "state/q"\n[admin]\nregistry_key = "state/./q"', "name the same object"),
    ('[manifest]\nkey = "state/q"\n[admin]\nregistry_key = "state/q-shard2"',
     "name the same object"),
])
def test_should_validate_the_manifest_key(tmp_path, text, words):
    assert words in refused(tmp_path, text)


@pytest.mark.parametrize("value", ["-1", "-0.5"])
def test_should_refuse_a_negative_snapshot_max_age(tmp_path, value):
    text = f"[collector]\ndedup_window_s = 0\nsnapshot_max_age_s = {value}\n"
    assert "collector.snapshot_max_age_s must be >= 0" in refused(tmp_path, text)
    # 0 stays: every snapshot outside the newest snapshot_keep_last expires
    zero = HEADER + "[collector]\ndedup_window_s = 0\nsnapshot_max_age_s = 0\n"
    assert load_config(write_config(tmp_path, zero), env={}
                       ).collector.snapshot_max_age_s == 0


@pytest.mark.parametrize(("text", "words"), [
    ("[ingestor]\ngrpc_port = 8080", "ingestor.grpc_port (8080) is the same port as "
                                     "ingestor.http_port"),
    ("[ingestor]\nkafka_port = 50051", "ingestor.kafka_port (50051) is the same port as "
                                       "ingestor.grpc_port"),
    ("[otlp]\nenabled = true\n[ingestor]\nkafka_port = 4318\notlp_http_port = 4318",
     "ingestor.otlp_http_port (4318) is the same port as ingestor.kafka_port"),
])
def test_should_refuse_two_ingestor_listeners_on_one_port(tmp_path, text, words):
    assert words in refused(tmp_path, text)


def test_should_let_listeners_share_port_zero(tmp_path):
    text = "[ingestor]\nhttp_port = 0\ngrpc_port = 0\nkafka_port = 0\n"
    config = load_config(write_config(tmp_path, HEADER + text), env={})
    assert (config.ingestor.http_port, config.ingestor.kafka_port) == (0, 0)


def test_should_name_collect_port_in_a_clash_it_causes(tmp_path):
    message = refused(tmp_path, env={"COLLECT_PORT": "50051"})
    assert "ingestor.grpc_port (50051) is the same port as ingestor.http_port" in message
    assert "ingestor.http_port is COLLECT_PORT=50051 in the environment" in message
