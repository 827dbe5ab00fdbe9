"""``icefloe streams`` and ``icefloe tables`` on real tables, filled by the real collector.

The tables are written the honest way: batches published to a local store, then the
collector (with the Spark-free :class:`pipeline.load.run.LocalEngine`) commits them to a SQLite
Iceberg catalog through the project's own commit path. The commands then read them with
pyiceberg, in-process via ``icefloe_app.cli.main``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest
from collector_support import BASE_MS, buy, click, drain, publish_sync, start

from icefloe.config import Config, load_config
from icefloe_app.cli import main
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import EPOCH_PROP, SEQUENCE_PROP

STREAMS = """
[[streams]]
name = "clicks"
table = "web.clicks"
columns = [
  { name = "user_id", type = "string", required = true, doc = "who clicked" },
  { name = "url", type = "string" },
  { name = "n", type = "long" },
  { name = "ts", type = "timestamp" },
]

[[streams]]
name = "buys"
table = "shop.buys"
event_id_field = "order_id"
unknown_fields = "reject"
partition = "hour"
# the hash of "s3cret-token" (icefloe token hash)
tokens = ["scrypt$ln=10,r=8,p=1$Uy9+nB9LdS457laXXhOuDg$xbvY79GcMOKR26tAvxzbzz6MUWeGffdxGlaGo0XYe3c"]
columns = [
  { name = "order_id", type = "string", required = true },
  { name = "amount", type = "double" },
  { name = "qty", type = "int" },
  { name = "paid", type = "boolean" },
  { name = "day", type = "date" },
  { name = "meta", type = "json" },
  { name = "ratio", type = "float" },
]

[[streams]]
name = "views"
table = "web.views"
columns = [{ name = "url", type = "string" }]

[[streams]]
name = "later"
table = "web.later"
columns = [{ name = "x", type = "long" }]
"""


def write_config(root: Path, catalog: str = 'uri = "sqlite:///catalog.db"') -> Path:
    path = root / "icefloe.toml"
    path.write_text(textwrap.dedent(f"""
        [store]
        url = "file://store"
        [catalog]
        {catalog}
        warehouse = "file://warehouse"
        [manifest]
        lease_s = 2.0
        [collector]
        host = "127.0.0.1"
        metrics_port = 0
        gc_interval_s = 3600
        maintenance_interval_s = 3600
        dequeue_every = 1
        """) + STREAMS)
    return path


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Config]:
    """Two collector runs into clicks and buys, one dead letter; ``later`` never created.

    The collector's config omits the stream ``later``, so its table stays uncreated while
    the CLI's config (the file) lists it.
    """
    from pipeline.load.run import LocalEngine

    root = tmp_path_factory.mktemp("tables")
    path = write_config(root)
    config = load_config(path)
    collecting = msgspec.structs.replace(config, streams=config.streams[:3])
    bad = ("clicks", "bad-1", BASE_MS, b'{"user_id":"u1","n":"not a number"}')

    async def fill() -> None:
        collector = await start(collecting, LocalEngine())
        publish_sync(collecting, [[click(i) for i in range(30)] + [buy(i) for i in range(5)]])
        await drain(collector)
        publish_sync(collecting, [[click(i) for i in range(30, 50)] + [bad]])
        await drain(collector)
        await collector.store.close()

    asyncio.run(fill())
    return path, config


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("icefloe: error: "), err
    return lines[0]


# --- streams -------------------------------------------------------------------------------

def test_should_list_streams_without_their_tokens(filled, capsys):
    path, _ = filled
    code, out, _ = run_cli(capsys, "streams", "list", "--config", str(path))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"config  {path}"
    header = next(line for line in lines if line.startswith("STREAM"))
    assert header.split() == ["STREAM", "TABLE", "COLUMNS", "EVENT", "ID", "UNKNOWN",
                              "FIELDS", "PARTITION", "TOKEN"]
    buys = next(line for line in lines if line.startswith("buys")).split()
    assert buys == ["buys", "shop.buys", "7", "order_id", "reject", "hour", "required"]
    assert next(line for line in lines if line.startswith("clicks")).split()[-1] == "no"
    assert "s3cret" not in out
    assert "scrypt" not in out

    data = run_json(capsys, "streams", "list", "--config", str(path))
    assert [s["name"] for s in data["streams"]] == ["clicks", "buys", "views", "later"]
    assert data["streams"][1]["tokens_required"] is True
    assert data["streams"][0]["columns"][0] == {"name": "user_id", "type": "string",
                                               "required": True, "doc": "who clicked",
                                               "mapping": None}
    assert "s3cret" not in json.dumps(data)
    assert "scrypt" not in json.dumps(data)


def test_should_show_one_stream_in_full(filled, capsys):
    path, _ = filled
    code, out, _ = run_cli(capsys, "streams", "show", "buys", "--config", str(path))
    assert code == 0
    assert "endpoint        POST /v1/streams/buys/events" in out
    assert "event id field  order_id" in out
    assert "partition       hour(_received_at)" in out
    assert "token           required" in out
    assert "s3cret" not in out
    assert "scrypt" not in out
    assert any(line.split()[:3] == ["meta", "json", "no"] for line in out.splitlines())

    data = run_json(capsys, "streams", "show", "clicks", "--config", str(path))
    assert data["table"] == "web.clicks"
    assert data["event_id_field"] is None
    assert data["unknown_fields"] == "ignore"
    assert data["partition"] == "day"
    assert data["tokens_required"] is False
    assert [c["name"] for c in data["columns"]] == ["user_id", "url", "n", "ts"]


def test_should_name_the_known_streams_for_an_unknown_one(filled, capsys):
    path, _ = filled
    code, out, err = run_cli(capsys, "streams", "show", "clikcs", "--config", str(path))
    assert code == 2
    assert out == ""
    assert one_line_error(err) == ("icefloe: error: unknown stream 'clikcs': "
                                   f"{path} defines clicks, buys, views, later")


# --- tables list ---------------------------------------------------------------------------

def test_should_list_every_table_with_its_commit_state(filled, capsys):
    path, config = filled
    catalog = open_catalog(config.catalog)
    clicks = catalog.load_table("web.clicks")
    snapshot = clicks.current_snapshot()
    code, out, _ = run_cli(capsys, "tables", "list", "--config", str(path))
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert rows["web.clicks"].split()[:6] == ["web.clicks", "clicks", str(snapshot.snapshot_id),
                                              "1", "50", "2"]
    assert rows["web.clicks"].endswith(" UTC")
    assert rows["shop.buys"].split()[:6] == ["shop.buys", "buys",
                                             str(catalog.load_table("shop.buys")
                                                 .current_snapshot().snapshot_id), "0", "5", "1"]
    assert rows["web.views"].split() == ["web.views", "views", "no", "commits", "yet", "0", "0"]
    assert rows["web.later"].split() == ["web.later", "later", "not", "created", "yet"]
    assert rows["icefloe.dead_letters"].split()[:6] == [
        "icefloe.dead_letters", "-",
        str(catalog.load_table("icefloe.dead_letters").current_snapshot().snapshot_id),
        "1", "1", "1"]


def test_should_list_tables_as_json(filled, capsys):
    path, config = filled
    data = run_json(capsys, "tables", "list", "--config", str(path))
    assert data["catalog_exists"] is True
    assert data["catalog"].startswith("sql catalog 'icefloe' at sqlite:///")
    tables = {t["table"]: t for t in data["tables"]}
    assert list(tables) == ["web.clicks", "shop.buys", "web.views", "web.later",
                            "icefloe.dead_letters"]
    snapshot = open_catalog(config.catalog).load_table("web.clicks").current_snapshot()
    assert tables["web.clicks"] == {
        "table": "web.clicks", "stream": "clicks", "exists": True,
        "snapshot_id": snapshot.snapshot_id, "sequence": 1, "epoch": 1, "rows": 50,
        "data_files": 2, "last_commit_ms": snapshot.timestamp_ms,
        "last_commit": tables["web.clicks"]["last_commit"]}
    assert tables["web.later"]["exists"] is False
    assert tables["web.later"]["snapshot_id"] is None
    assert tables["web.views"]["exists"] is True
    assert tables["web.views"]["rows"] is None
    assert tables["icefloe.dead_letters"]["rows"] == 1
    assert tables["icefloe.dead_letters"]["stream"] is None


def test_should_report_a_catalog_that_does_not_exist_yet_without_creating_it(tmp_path,
                                                                              capsys):
    path = write_config(tmp_path)
    code, out, _ = run_cli(capsys, "tables", "list", "--config", str(path))
    assert code == 0
    assert "does not exist yet" in out
    assert "web.clicks  clicks  not created yet" in out
    assert "dead_letters" not in out
    data = run_json(capsys, "tables", "list", "--config", str(path))
    assert data["catalog_exists"] is False
    assert not any(t["exists"] for t in data["tables"])
    assert not (tmp_path / "catalog.db").exists()
    assert not (tmp_path / "warehouse").exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("command", [["tables", "list"], ["tables", "history", "clicks"]])
def test_should_say_in_one_line_that_the_catalog_is_unreachable(tmp_path, capsys, command):
    port = free_port()  # closed again: connections are refused
    path = write_config(tmp_path, catalog=f'uri = "postgresql://icefloe:pw@127.0.0.1:{port}/x"')
    code, out, err = run_cli(capsys, *command, "--config", str(path))
    assert code == 1
    assert out == ""
    line = one_line_error(err)
    assert line.startswith("icefloe: error: cannot open sql catalog 'icefloe' at "
                           f"postgresql://icefloe:***@127.0.0.1:{port}/x")
    assert "PostgreSQL is running" in line
    assert ":pw@" not in err


def test_should_say_in_one_line_that_a_sqlite_catalog_is_unusable(tmp_path, capsys):
    (tmp_path / "catalog.db").mkdir()  # exists, but no database can be opened there
    path = write_config(tmp_path)
    code, _, err = run_cli(capsys, "tables", "list", "--config", str(path))
    assert code == 1
    line = one_line_error(err)
    assert line.startswith("icefloe: error: cannot open sql catalog 'icefloe' at sqlite:///")
    assert "writable file" in line


# --- tables history ------------------------------------------------------------------------

def test_should_show_a_tables_snapshots_newest_first(filled, capsys):
    path, config = filled
    clicks = open_catalog(config.catalog).load_table("web.clicks")
    newest = clicks.current_snapshot()
    code, out, _ = run_cli(capsys, "tables", "history", "clicks", "--config", str(path))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "table     web.clicks  (stream clicks)"
    assert lines[1] == f"snapshots 2, current {newest.snapshot_id}"
    assert lines[3].split() == ["VERSION", "SNAPSHOT", "COMMITTED", "AT", "OPERATION",
                                "SEQUENCE", "EPOCH", "+ROWS", "ROWS", "+FILES", "FILES"]
    first = lines[4].split()
    assert first[:2] == ["2", f"{newest.snapshot_id}*"]
    assert first[5:] == ["append", "1", "1", "20", "50", "1", "2"]
    second = lines[5].split()
    assert second[:2] == ["1", str(newest.parent_snapshot_id)]
    assert second[5:] == ["append", "0", "1", "30", "30", "1", "1"]


def test_should_show_history_as_json_with_a_limit(filled, capsys):
    path, config = filled
    newest = open_catalog(config.catalog).load_table("web.clicks").current_snapshot()
    data = run_json(capsys, "tables", "history", "web.clicks", "--limit", "1", "--config",
                    str(path))
    assert data["table"] == "web.clicks"
    assert data["stream"] == "clicks"
    assert data["snapshot_count"] == 2
    assert data["current_snapshot_id"] == newest.snapshot_id
    (entry,) = data["snapshots"]
    assert entry["snapshot_id"] == newest.snapshot_id
    assert entry["current"] is True
    assert entry["version"] == 2
    assert entry["operation"] == "append"
    assert (entry["sequence"], entry["epoch"]) == (1, 1)
    assert (entry["added_rows"], entry["total_rows"]) == (20, 50)
    assert (entry["added_files"], entry["total_files"]) == (1, 2)
    assert entry["summary"][SEQUENCE_PROP] == "1"
    assert entry["summary"][EPOCH_PROP] == "1"

    code, out, _ = run_cli(capsys, "tables", "history", "clicks", "--limit", "1", "--config",
                           str(path))
    assert code == 0
    assert "... 1 older (use --limit 0 to show all)" in out


def test_should_show_the_dead_letter_tables_history(filled, capsys):
    path, _ = filled
    data = run_json(capsys, "tables", "history", "icefloe.dead_letters", "--config", str(path))
    assert data["stream"] is None
    assert [s["added_rows"] for s in data["snapshots"]] == [1]


def test_should_say_when_a_table_has_no_commits(filled, capsys):
    path, _ = filled
    code, out, _ = run_cli(capsys, "tables", "history", "views", "--config", str(path))
    assert code == 0
    assert out.splitlines() == ["table     web.views  (stream views)",
                                "snapshots none: no commits yet"]


@pytest.mark.parametrize(("name", "code", "message"), [
    ("later", 1, "table web.later (stream later) is not created yet: the collector creates "
                 "it when it starts (`icefloe up`)"),
    ("web.nope", 1, "no table web.nope in sql catalog 'icefloe' at sqlite:///"),
    ("nope", 2, "'nope' is neither a stream nor a table: name a stream (clicks, buys, views, "
                "later) or a table as namespace.table (e.g. web.pageviews)"),
])
def test_should_refuse_unknown_names_in_one_line(filled, capsys, name, code, message):
    path, _ = filled
    result, out, err = run_cli(capsys, "tables", "history", name, "--config", str(path))
    assert result == code
    assert out == ""
    assert one_line_error(err).startswith(f"icefloe: error: {message}")
    if name == "web.nope":
        assert "tables there: icefloe.dead_letters, shop.buys, web.clicks, web.views" in err


def test_should_list_the_registrys_sink_tables_too(tmp_path, capsys):
    """Sources and sinks made with the admin API live in the registry, not the file: their
    tables are listed after the configured ones (a table both name is listed once)."""
    from icefloe.config import Column
    from icefloe.registry import RegistryStore, ops
    from icefloe.store import open_async_store

    path = write_config(tmp_path)
    config = load_config(path)
    columns = (Column("order_id", "string"),)

    async def register() -> None:
        store = open_async_store(config.store.url)
        registry = RegistryStore(store, config.admin.registry_key)
        await registry.update(lambda r: ops.create_source(r, ops.SourceSpec(id="clicks", sinks=(
            ops.SinkSpec(name="clicks", table="web.clicks", columns=columns),))))
        await registry.update(lambda r: ops.create_source(r, ops.SourceSpec(id="shop", sinks=(
            ops.SinkSpec(name="orders", table="shop.orders", columns=columns),
            ops.SinkSpec(name="shop", table="shop.all", columns=columns)))))
        await store.close()
    asyncio.run(register())
    code, out, _ = run_cli(capsys, "tables", "list", "--config", str(path))
    assert code == 0
    rows = [line.split() for line in out.splitlines()[2:] if line.strip()]
    assert [r[:2] for r in rows] == [["TABLE", "STREAM"], ["web.clicks", "clicks"],
                                     ["shop.buys", "buys"], ["web.views", "views"],
                                     ["web.later", "later"], ["shop.orders", "shop/orders"],
                                     ["shop.all", "shop"]]
    assert rows[-2][2:] == ["not", "created", "yet"]
    data = run_json(capsys, "tables", "list", "--config", str(path))
    assert [(t["table"], t["stream"]) for t in data["tables"]][-2:] == [
        ("shop.orders", "shop/orders"), ("shop.all", "shop")]
