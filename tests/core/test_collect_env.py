"""OndatraSQL's ``COLLECT_PORT`` / ``COLLECT_ADMIN_PORT`` (#37): the daemon's port variables
move icefloe's ingestor HTTP port and admin API port, below icefloe's own names and flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from icefloe.config.load import load_config
from icefloe.errors import ConfigError


def test_collect_port_sets_ingestor_and_next_port_for_admin() -> None:
    config = load_config(None, env={"COLLECT_PORT": "9090"})
    assert (config.ingestor.http_port, config.admin.port) == (9090, 9091)


def test_collect_admin_port_is_the_admin_port() -> None:
    config = load_config(None, env={"COLLECT_PORT": "9090", "COLLECT_ADMIN_PORT": "7000"})
    assert (config.ingestor.http_port, config.admin.port) == (9090, 7000)
    assert load_config(None, env={"COLLECT_ADMIN_PORT": "7001"}).admin.port == 7001


def test_collect_env_beats_the_file_icefloe_env_and_flags_beat_it(tmp_path: Path) -> None:
    conf = tmp_path / "icefloe.toml"
    conf.write_text("[ingestor]\nhttp_port = 1111\n[admin]\nport = 2222\n")
    env = {"COLLECT_PORT": "9090"}
    config = load_config(conf, env=env)
    assert (config.ingestor.http_port, config.admin.port) == (9090, 2222)  # derived: a default
    env |= {"COLLECT_ADMIN_PORT": "7000"}
    assert load_config(conf, env=env).admin.port == 7000
    env |= {"ICEFLOE_INGESTOR_HTTP_PORT": "8088", "ICEFLOE_ADMIN_PORT": "8089"}
    config = load_config(conf, env=env)
    assert (config.ingestor.http_port, config.admin.port) == (8088, 8089)
    flagged = load_config(conf, env=env, overrides={"ingestor": {"http_port": 1}})
    assert flagged.ingestor.http_port == 1


@pytest.mark.parametrize("value", ["http", "-1", "70000", "80.5"])
def test_a_bad_collect_port_is_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigError, match=f"COLLECT_PORT: '{value}' is not a port number"):
        load_config(None, env={"COLLECT_PORT": value})
