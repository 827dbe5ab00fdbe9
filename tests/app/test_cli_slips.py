"""User slips on the command line: a setting given is honoured, a mistake is one line and
exit 2 (never a traceback, never silently ignored)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from icefloe.manifest import BatchRef, ManifestConfig, ManifestConsumer, ManifestProducer
from icefloe.store import open_async_store
from icefloe_app.cli import build_parser, main


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ICEFLOE_* variables of the caller's, no ./icefloe.toml but the test's own."""
    for name in list(os.environ):
        if name.startswith("ICEFLOE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _refused_by_argparse(words: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser(words).parse_args(words)
    assert exit_.value.code == 2
    return capsys.readouterr().err


# --- 1. models: [collector] models_dir ------------------------------------------------------

def _models_project(root: Path, folder: str = "sql") -> Path:
    (root / folder).mkdir(parents=True)
    (root / folder / "m.sql").write_text("-- materialized: view\nSELECT 1 AS one\n")
    config = root / "icefloe.toml"
    config.write_text(f'[collector]\nmodels_dir = "{folder}"\n')
    return config


def test_models_list_reads_collector_models_dir_relative_to_the_config(tmp_path, capsys,
                                                                       monkeypatch):
    config = _models_project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative to the config file, not the working directory
    assert main(["models", "list", "--config", str(config), "--data-dir",
                 str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert "m " in out
    assert "not stored (view)" in out
    assert main(["models", "show", "m", "--config", str(config), "--data-dir",
                 str(tmp_path / "data")]) == 0
    assert f"{tmp_path / 'project' / 'sql' / 'm.sql'}" in capsys.readouterr().out


def test_models_list_reads_the_models_dir_environment_variable(tmp_path, capsys, monkeypatch):
    config = _models_project(tmp_path, "other")
    config.write_text("")  # only the environment names it
    monkeypatch.setenv("ICEFLOE_COLLECTOR_MODELS_DIR", "other")
    assert main(["models", "list", "--config", str(config), "--data-dir",
                 str(tmp_path / "data")]) == 0
    assert "not stored (view)" in capsys.readouterr().out


def test_models_flag_wins_and_a_missing_folder_is_a_usage_error(tmp_path, capsys):
    config = _models_project(tmp_path)
    assert main(["models", "list", "--config", str(config), "--models", "nowhere",
                 "--data-dir", str(tmp_path / "data")]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "nowhere (--models) does not exist" in line


# --- 2. inspect manifest: [manifest] key ----------------------------------------------------

def _fill(url: str, key: str) -> None:
    async def run() -> None:
        store = open_async_store(url)
        manifest = ManifestConfig(key=key)
        await ManifestConsumer(store, manifest, holder="collector-test").initialize()
        producer = ManifestProducer(store, manifest)
        await producer.append(BatchRef("batches/b0.ifb", 100, 7, 10, ("pageviews",),
                                       time.time()))
        await store.close()

    asyncio.run(run())


def test_inspect_manifest_reads_the_configured_manifest_key(tmp_path, capsys):
    url = (tmp_path / "store").as_uri()
    _fill(url, "q/main")
    config = tmp_path / "icefloe.toml"
    config.write_text(f'[store]\nurl = "{url}"\n\n[manifest]\nkey = "q/main"\n')
    assert main(["inspect", "manifest", "--config", str(config)]) == 0
    assert "batches/b0.ifb" in capsys.readouterr().out
    assert main(["inspect", "manifest", "--config", str(config), "--store", url]) == 0
    assert "batches/b0.ifb" in capsys.readouterr().out
    # an explicit --key still wins
    assert main(["inspect", "manifest", "--config", str(config), "--key", "other/q"]) == 1
    assert "'other/q'" in _one_line_error(capsys.readouterr().err)


# --- 3. up: [otlp] enabled ------------------------------------------------------------------

@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``icefloe up`` runs up to the point of starting, then stops: what it would start."""
    from icefloe_app.cli import up_cmd

    seen: dict[str, Any] = {}

    def fake_run_guarded(main_: Any, config: Any, *, runner: Any) -> int:
        seen["up"] = main_.__self__
        seen["env"] = os.environ.get("ICEFLOE_OTLP_ENABLED")
        return 0

    monkeypatch.setattr(up_cmd, "run_guarded", fake_run_guarded)
    for name in ("ICEFLOE_OTLP_ENABLED", "GRPC_ENABLE_FORK_SUPPORT"):
        monkeypatch.setenv(name, "x")  # up sets them: restored after the test
        monkeypatch.delenv(name)
    return seen


def _up(tmp_path: Path, *extra: str) -> int:
    return main(["up", "--config", str(tmp_path / "icefloe.toml"), "--data-dir",
                 str(tmp_path / "data"), "--no-collector", *extra])


def test_up_honours_otlp_disabled_in_the_file(tmp_path, started):
    (tmp_path / "icefloe.toml").write_text("[otlp]\nenabled = false\n")
    assert _up(tmp_path) == 0
    assert started["up"].config.otlp.enabled is False
    assert started["up"].otlp_ports is None
    assert started["env"] == "false"  # what the ingestor processes read


def test_up_honours_otlp_disabled_in_the_environment(tmp_path, started, monkeypatch):
    (tmp_path / "icefloe.toml").write_text("")
    monkeypatch.setenv("ICEFLOE_OTLP_ENABLED", "false")
    assert _up(tmp_path) == 0
    assert started["up"].otlp_ports is None
    assert started["env"] == "false"


def test_up_turns_otlp_on_when_nothing_says(tmp_path, started):
    (tmp_path / "icefloe.toml").write_text("")
    assert _up(tmp_path) == 0
    assert started["up"].config.otlp.enabled is True
    assert started["up"].otlp_ports == (4318, 4317)
    assert started["env"] == "true"
    assert _up(tmp_path, "--no-otlp") == 0
    assert started["up"].otlp_ports is None
    assert started["env"] == "false"


def test_up_refuses_an_otlp_port_with_otlp_off(tmp_path, started, capsys):
    (tmp_path / "icefloe.toml").write_text("[otlp]\nenabled = false\n")
    assert _up(tmp_path, "--otlp-http-port", "4400") == 2
    assert "--otlp-http-port 4400: OTLP is off" in _one_line_error(capsys.readouterr().err)
    assert "up" not in started


@pytest.mark.parametrize(("flags", "named"), [
    (("--http-port", "18080", "--otlp-http-port", "18080"), "--otlp-http-port"),
    (("--grpc-port", "18081", "--kafka-port", "18081"), "--kafka-port"),
    (("--otlp-grpc-port", "18082", "--http-port", "18082"), "--otlp-grpc-port"),
])
def test_up_refuses_two_of_its_listeners_on_one_port(tmp_path, started, capsys, flags,
                                                     named):
    """The ingestors', the collector's and the admin API's ports on one host: a clash is
    refused before anything starts, naming both flags."""
    (tmp_path / "icefloe.toml").write_text("")
    assert _up(tmp_path, *flags) == 2
    error = _one_line_error(capsys.readouterr().err)
    assert "is the same port as" in error
    assert named in error
    assert "up" not in started


# --- 4. define: a module that does not import ------------------------------------------------

@pytest.fixture
def own_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # define puts the cwd first


@pytest.mark.usefixtures("own_sys_path")
def test_define_names_the_file_of_a_syntax_error(tmp_path, capsys):
    (tmp_path / "slip_syntax.py").write_text("class X:\n    x: int = (\n")
    assert main(["define", "slip_syntax.py:X", "--stream", "s", "--table", "a.b"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "slip_syntax.py, line 2" in line
    assert "SyntaxError" in line


@pytest.mark.usefixtures("own_sys_path")
def test_define_names_the_file_of_a_module_that_raises(tmp_path, capsys):
    (tmp_path / "slip_raises.py").write_text("import os\nraise RuntimeError('boom')\n")
    assert main(["define", "slip_raises.py:X", "--stream", "s", "--table", "a.b"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "slip_raises.py, line 2" in line
    assert "RuntimeError: boom" in line


# --- 5, 6. sql --limit, --as-of -------------------------------------------------------------

@pytest.mark.parametrize("limit", ["-3", "-1", "x"])
def test_sql_refuses_a_negative_limit(limit, capsys):
    err = _refused_by_argparse(["sql", "SELECT 1", "--limit", limit], capsys)
    assert "argument --limit" in err


def test_sql_limit_zero_still_means_all_rows():
    words = ["sql", "SELECT 1", "--limit", "0"]
    assert build_parser(words).parse_args(words).limit == 0


def test_a_bad_as_of_is_a_usage_error(tmp_path, capsys):
    assert main(["sql", "SELECT 1", "--as-of", "garbage", "--data-dir",
                 str(tmp_path / "data")]) == 2
    assert "--as-of 'garbage': give a snapshot id" in _one_line_error(capsys.readouterr().err)


# --- 7. ingestor --stats-interval -----------------------------------------------------------

@pytest.mark.parametrize("seconds", ["-1", "0", "nan", "soon"])
def test_ingestor_refuses_a_stats_interval_that_is_not_positive(seconds, capsys):
    err = _refused_by_argparse(["ingestor", "--stats-interval", seconds], capsys)
    assert "argument --stats-interval" in err


def test_ingestor_takes_a_positive_stats_interval():
    words = ["ingestor", "--stats-interval", "0.5"]
    assert build_parser(words).parse_args(words).stats_interval == 0.5


# --- 8. sources --url -----------------------------------------------------------------------

@pytest.mark.parametrize("url", ["notaurl", "ftp://host", "http://", "http://host:port"])
def test_sources_refuses_a_url_that_is_not_one(url, capsys, monkeypatch):
    monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", "not-checked")
    assert main(["sources", "list", "--url", url]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"--url {url!r}" in line
    assert "unreachable" not in line
