"""The security settings of icefloe.toml: shapes, paths, environment and precise errors."""

from __future__ import annotations

import textwrap

import pytest
from config_support import write_config

from icefloe.client import ClientTls
from icefloe.config import RateLimit, load_config
from icefloe.config.security import needs_token
from icefloe.errors import ConfigError
from icefloe.tokens import hash_token

STREAMS = textwrap.dedent("""
    [[streams]]
    name = "pageviews"
    table = "web.pageviews"
    columns = [{ name = "url", type = "string" }]
    [[streams]]
    name = "orders"
    table = "shop.orders"
    columns = [{ name = "id", type = "string" }]
""")


def write(tmp_path, text: str):
    return write_config(tmp_path, textwrap.dedent(text) + STREAMS)


def test_should_load_tls_tokens_limits_and_proxies(tmp_path):
    line = hash_token("tok", log2_n=10)
    path = write(tmp_path, f"""
        [ingestor]
        tls_cert_file = "tls/server.pem"
        tls_key_file = "/etc/icefloe/server.key"
        tls_client_ca_file = "tls/clients.pem"
        trusted_proxies = ["10.0.0.0/8", "127.0.0.1", "2001:db8::/32"]
        client_rate_limit = {{ events_per_s = 50 }}
        [[tokens]]
        name = "web"
        hash = "{line}"
        streams = ["pageviews"]
        rate_limit = {{ events_per_s = 1000, bytes_per_s = 1_000_000, burst_s = 2 }}
    """)
    config = load_config(path, env={})
    ing = config.ingestor
    assert ing.tls_cert_file == str(tmp_path / "tls" / "server.pem")  # relative: config folder
    assert ing.tls_key_file == "/etc/icefloe/server.key"
    assert ing.tls_client_ca_file == str(tmp_path / "tls" / "clients.pem")
    assert ing.client_rate_limit == RateLimit(events_per_s=50)
    assert config.tokens[0].rate_limit == RateLimit(1000, 1_000_000, 2)
    assert needs_token(config, "pageviews")
    assert not needs_token(config, "orders")


def test_should_read_lists_but_not_tables_from_the_environment(tmp_path):
    env = {"ICEFLOE_INGESTOR_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.1.1",
           "ICEFLOE_INGESTOR_PLAINTEXT": "true"}
    config = load_config(write(tmp_path, ""), env=env)
    assert config.ingestor.trusted_proxies == ("10.0.0.0/8", "192.168.1.1")
    assert config.ingestor.plaintext is True
    # a table is file only: set in the environment it is refused by name, not ignored
    with pytest.raises(ConfigError, match="ICEFLOE_INGESTOR_CLIENT_RATE_LIMIT"):
        load_config(write(tmp_path, ""), env={
            **env, "ICEFLOE_INGESTOR_CLIENT_RATE_LIMIT": "tables are file only"})


@pytest.mark.parametrize(("text", "error"), [
    ('[ingestor]\ntls_cert_file = "a.pem"', "ingestor.tls_key_file: TLS needs both"),
    ('[ingestor]\ntls_key_file = "a.key"', "ingestor.tls_cert_file: TLS needs both"),
    ('[ingestor]\ntls_client_ca_file = "ca.pem"', "ingestor.tls_client_ca_file: mutual TLS"),
    ('[ingestor]\ntls_cert_file = "a.pem"\ntls_key_file = "a.key"\nplaintext = true',
     "ingestor.plaintext: true contradicts tls_cert_file"),
    ('[ingestor]\ntrusted_proxies = ["10.0.0.0/33"]', "ingestor.trusted_proxies[0]: "
                                                      "'10.0.0.0/33' is not an IP"),
    ('[ingestor]\nforwarded_header = "x-real-ip"', "ingestor.forwarded_header: 'x-real-ip' "
                                                   "is not one of"),
    ("[ingestor]\nheader_timeout_s = 0", "ingestor.header_timeout_s must be > 0"),
    ("[ingestor]\nbody_min_bytes_per_s = -1", "ingestor.body_min_bytes_per_s must be >= 0"),
    ("[ingestor]\ngrpc_max_streams_per_connection = 0",
     "ingestor.grpc_max_streams_per_connection must be > 0"),
    ("[ingestor]\nclient_rate_limit = { events_per_s = 0 }",
     "ingestor.client_rate_limit.events_per_s must be > 0"),
])
def test_should_name_the_wrong_security_key(tmp_path, text, error):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value).startswith(f"{path}: {error}")


def test_should_check_a_stream_rate_limit(tmp_path):
    path = tmp_path / "icefloe.toml"
    path.write_text(STREAMS.replace('name = "orders"', 'name = "orders"\n'
                                    "rate_limit = { bytes_per_s = 10, burst_s = -1 }"))
    with pytest.raises(ConfigError, match=r"streams\[1\].rate_limit.burst_s must be > 0"):
        load_config(path, env={})


def test_should_want_a_client_certificate_with_its_key():
    with pytest.raises(ValueError, match="cert_file and key_file together"):
        ClientTls(cert_file="client.pem")


def test_should_keep_symlinks_in_tls_paths_so_rotations_are_followed(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "tls.crt").write_text("")
    (tmp_path / "current").symlink_to(tmp_path / "v1", target_is_directory=True)
    path = write(tmp_path, '[ingestor]\ntls_cert_file = "current/tls.crt"\n'
                           'tls_key_file = "./current/../current/tls.key"\n')
    config = load_config(path, env={})
    assert config.ingestor.tls_cert_file == str(tmp_path / "current" / "tls.crt")
    assert config.ingestor.tls_key_file == str(tmp_path / "current" / "tls.key")
