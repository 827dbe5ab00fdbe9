"""A ``sql`` column mapping can neither run what it should not nor wedge the queue (#29).

Admission: functions outside the allow-list (JVM calls, raising functions, unknown or
qualified names, non-determinism) are refused by name at config load and by the admin API.
Routing: an entry is projected with the mappings of the registry version it carries, so a
deleted sink's expression never runs on events accepted after the deletion.
Runtime: an allow-listed expression that throws on some row costs that row's value (null,
counted in ``icefloe_collector_sql_errors_total``), never the run; every other table keeps
committing. Real local store, real SQLite catalog, real Spark collector where it matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.routing import Routes
from icefloe.config import Column, StreamConfig, load_config
from icefloe.errors import ConfigError
from icefloe.registry import Registry, ops
from icefloe.registry.model import Sink
from tests.app.test_admin_api import Admin, admin  # noqa: F401  (the served admin API fixture)
from tests.collector_support import (
    BASE_MS,
    BUYS,
    CLICKS,
    assert_exact,
    buy,
    change_registry,
    collect_all,
    collector_config,
    drain,
    ids,
    open_store_of,
    output_engine,
    publish,
    read_table,
    start,
)

REFUSED = [
    ("reflect('java.lang.System', 'exit', 0)", "function reflect is not allowed"),
    ("java_method('java.lang.Runtime', 'getRuntime')", "function java_method is not allowed"),
    ("try_reflect('java.util.UUID', 'randomUUID')", "function try_reflect is not allowed"),
    ("raise_error('boom')", "function raise_error is not allowed"),
    ("assert_true(url = 'x')", "function assert_true is not allowed"),
    ("no_such_function(url)", "function no_such_function is not allowed"),
    ("`reflect`('a', 'b')", "function reflect is not allowed"),
    ("default.my_udf(url)", "function default.my_udf is not allowed"),
    ("concat(url, uuid())", "function uuid is not allowed"),
    ("cast(current_timestamp() AS string)", "function current_timestamp is not allowed"),
    ("repeat(url, 1000000000)", "function repeat is not allowed"),
]


def click_at(i: int, url: str, prefix: str) -> tuple[str, str, int, bytes]:
    payload = msgspec.json.encode({"user_id": f"u{i}", "url": url, "n": i})
    return ("clicks", f"{prefix}{i}", BASE_MS + i, payload)


def clicks(prefix: str, count: int, bad: int | None = None) -> list[tuple[str, str, int, bytes]]:
    """``count`` clicks; the one at index ``bad`` has a url that is not a valid regex."""
    return [click_at(i, "(" if i == bad else f"/p/{i}", prefix) for i in range(count)]


def toml_string(text: str) -> str:
    return msgspec.json.encode(text).decode()  # a JSON string is a TOML basic string


# -- admission ---------------------------------------------------------------------------


@pytest.mark.parametrize(("sql", "expected"), REFUSED)
def test_a_sql_mapping_outside_the_allow_list_is_refused_at_load_by_name(
        tmp_path: Path, sql: str, expected: str) -> None:
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "s"\ntable = "a.b"\ncolumns = [\n'
                    '  { name = "url", type = "string" },\n'
                    f'  {{ name = "x", type = "string", sql = {toml_string(sql)} }},\n]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "streams[0].columns[1] (x): " in message, message
    assert expected in message, message
    assert "allowed: see docs/streams.md" in message or "without arguments" in message, message


@pytest.mark.parametrize("sql", [
    "lower(url)", "regexp_extract(url, '/p/(\\\\d+)', 1)", "sha2(url, 256)",
    "coalesce(get_json_object(url, '$.a'), 'none')", "date_format(ts, 'yyyy-MM')",
    "CASE WHEN n > 1 THEN upper(url) ELSE url END", "url RLIKE '^/p'",
    "transform(split(url, '/'), x -> upper(x))[1]", "unix_timestamp(ts)",
    "CASE WHEN n > 1 AND url IS NOT NULL THEN 'a' ELSE 'b' END",  # AND/OR are operators,
    "if(n > 1 OR NOT n < 0, url, 'x')",  # not functions (sqlglot models them as Func too)
])
def test_common_pure_expressions_are_accepted(tmp_path: Path, sql: str) -> None:
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "s"\ntable = "a.b"\ncolumns = [\n'
                    '  { name = "url", type = "string" }, { name = "n", type = "long" },\n'
                    '  { name = "ts", type = "timestamp" },\n'
                    f'  {{ name = "x", type = "string", sql = {toml_string(sql)} }},\n]\n')
    load_config(path)


SIZED = [  # #36: accepted before, though the docs said such functions were refused
    ("printf('%999999999d', n)", "function printf asks for 1000000010 characters per row"),
    ("format_string('%.70000f', n)", "function format_string asks for 70008 characters"),
    ("lpad(url, 999999999, '0')", "function lpad asks for 999999999 characters per row"),
    ("rpad(url, n, ' ')", "function rpad needs a literal width"),
    ("printf(url, n)", "function printf needs a literal format"),
    ("regexp_replace(lpad(url, 60000, 'x'), 'x', 'yy')",
     "function regexp_replace over \"LPAD(url, 60000, 'x')\" can give 180000 characters"),
]


def write_mapping(tmp_path: Path, sql: str) -> Path:
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "s"\ntable = "a.b"\ncolumns = [\n'
                    '  { name = "url", type = "string" }, { name = "n", type = "long" },\n'
                    f'  {{ name = "x", type = "string", sql = {toml_string(sql)} }},\n]\n')
    return path


@pytest.mark.parametrize(("sql", "expected"), SIZED)
def test_a_size_argument_beyond_the_limit_or_not_literal_is_refused_at_load(
        tmp_path: Path, sql: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write_mapping(tmp_path, sql))
    assert "streams[0].columns[2] (x): " in str(info.value)
    assert expected in str(info.value)
    assert "at most 65536" in str(info.value) or "literal" in str(info.value)


@pytest.mark.parametrize("sql", ["lpad(url, 8, '0')", "rpad(url, 65536)",
                                 "printf('%05d-%s', n, url)", "format_string('%.2f', n)",
                                 "regexp_replace(lpad(url, 8, '0'), '0', '-')",
                                 "overlay(url placing 'x' from 2)"])
def test_a_literal_size_within_the_limit_is_accepted(tmp_path: Path, sql: str) -> None:
    load_config(write_mapping(tmp_path, sql))


@pytest.mark.parametrize(("sql", "expected"), SIZED[:3])
def test_the_admin_api_refuses_a_padded_printf_with_json_naming_it(
        admin: Admin, sql: str, expected: str) -> None:  # noqa: F811
    reply = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "x", "table": "a.x", "columns": [
            {"name": "url", "type": "string"}, {"name": "n", "type": "long"},
            {"name": "bad", "type": "string", "sql": sql}]})
    assert reply.status_code == 400, reply.text
    [detail] = reply.json()["details"]
    assert detail["field"] == "sink.columns[2] (bad)"
    assert expected in detail["reason"]


def test_other_dialects_are_checked_as_spark_runs_them(tmp_path: Path) -> None:
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "s"\ntable = "a.b"\ncolumns = [\n'
                    '  { name = "url", type = "string" },\n'
                    '  { name = "x", type = "string", sql = "now()", dialect = "postgres" },\n]\n')
    with pytest.raises(ConfigError, match="function current_timestamp is not allowed"):
        load_config(path)


@pytest.mark.parametrize(("sql", "expected"), REFUSED[:6])
def test_the_admin_api_refuses_them_with_json_naming_the_function(
        admin: Admin, sql: str, expected: str) -> None:  # noqa: F811
    reply = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "x", "table": "a.x", "columns": [
            {"name": "url", "type": "string"}, {"name": "bad", "type": "string", "sql": sql}]})
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    assert body["error"] == "invalid"
    [detail] = body["details"]
    assert detail["field"] == "sink.columns[1] (bad)"
    assert expected in detail["reason"], body
    assert admin.client.get("/v1/sources/clicks/sinks/x").status_code == 404


def test_the_admin_api_refuses_them_in_a_patch_too(admin: Admin) -> None:  # noqa: F811
    columns = [*msgspec.to_builtins(CLICKS.columns),
               {"name": "host", "type": "string", "sql": "java_method('a', 'b', url)"}]
    reply = admin.client.patch("/v1/sources/clicks/sinks/clicks", json={"columns": columns})
    assert reply.status_code == 400, reply.text
    assert "function java_method is not allowed" in reply.json()["details"][0]["reason"]


# -- routing: the mappings of the version an entry carries --------------------------------

RX = ops.SinkSpec(name="rx", table="web.rx", columns=(
    Column("user_id", "string", required=True), Column("url", "string"),
    Column("rx", "string", sql="regexp_extract(url, url, 0)")))
CLICKS_SINK = ops.SinkSpec(name="clicks", table="web.clicks", columns=CLICKS.columns)
BUYS_SINK = ops.SinkSpec(name="buys", table="shop.buys", columns=BUYS.columns)


def with_raw_sql(registry: Registry, source: str, sink: str, sql: str) -> Registry:
    """The registry with ``sink``'s sql column set to ``sql`` as is: what a registry written
    before the allow-list (or by hand) may hold; the admin API refuses it."""
    def patched(s: Sink) -> Sink:
        if s.name != sink:
            return s
        return msgspec.structs.replace(s, columns=tuple(
            msgspec.structs.replace(c, sql=sql) if c.sql is not None else c
            for c in s.columns))
    return msgspec.structs.replace(registry, version=registry.version + 1, sources=tuple(
        msgspec.structs.replace(src, sinks=tuple(patched(s) for s in src.sinks))
        if src.id == source else src for src in registry.sources))


async def test_a_deleted_sinks_sql_is_not_part_of_later_entries(tmp_path: Path) -> None:
    config = collector_config(tmp_path, (CLICKS,))
    before = await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK, RX))))
    after = await change_registry(config, lambda r: ops.delete_sink(r, "clicks", "rx"))
    routes = Routes(after)
    cases = routes.sql_cases({"clicks": {10: before.version, 11: after.version,
                                         12: after.version}})
    [case] = cases["clicks"]["rx"]
    assert (case.sql, case.ranges) == ("regexp_extract(url, url, 0)", ((10, 10),))
    assert routes.sql_cases({"clicks": {11: after.version}}) == {"clicks": {}}


# -- the whole way, on Spark ----------------------------------------------------------------


async def test_a_throwing_deleted_sink_does_not_block_any_table(tmp_path: Path,
                                                                spark: Any) -> None:
    """The issue's scenario: sinks whose expressions throw (``raise_error`` written into
    the registry directly; an allow-listed regex read from the data), events before and
    after their deletion, and another source's traffic: the queue drains, every table
    commits, the throwing values are null and counted, and the deleted sinks' expressions
    never run on the events accepted after the deletion."""
    from pipeline.load.run import SparkEngine

    config = collector_config(tmp_path, (CLICKS, BUYS))
    boom = ops.SinkSpec(name="boom", table="web.boom", columns=(
        Column("user_id", "string", required=True), Column("oops", "string", sql="lower('x')")))
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK, RX, boom))))
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="buys", sinks=(BUYS_SINK,))))
    armed = await change_registry(config, lambda r: with_raw_sql(r, "clicks", "boom",
                                                        "raise_error('boom')"))
    store = open_store_of(config)
    await publish(store, [clicks("a", 6, bad=2)], registry_version=armed.version)
    await change_registry(config, lambda r: ops.delete_sink(r, "clicks", "rx"))
    gone = await change_registry(config, lambda r: ops.delete_sink(r, "clicks", "boom"))
    await publish(store, [clicks("b", 6, bad=1), clicks("c", 4, bad=0),
                          [buy(i) for i in range(5)]], registry_version=gone.version)
    await store.close()

    collector = await start(config, SparkEngine(spark, 2))
    try:
        await drain(collector)
        assert await collector.consumer.read(max_entries=10) == []
    finally:
        await collector.store.close()
    assert_exact(config, "web.clicks", ids("a", 6) | ids("b", 6) | ids("c", 4))
    assert_exact(config, "shop.buys", ids("b", 5))
    rx = {r["_event_id"]: r["rx"] for r in read_table(config, "web.rx").to_pylist()}
    assert rx == {f"a{i}": None if i == 2 else f"/p/{i}" for i in range(6)}
    assert set(read_table(config, "web.boom").column("oops").to_pylist()) == {None}
    errors = collector.metrics.registry.get_sample_value(
        "icefloe_collector_sql_errors_total", {"stream": "clicks", "column": "rx"})
    assert errors == 1  # only a2: b1 and c0 came after the deletion and were not evaluated


@pytest.mark.parametrize("output", ["embedded", "cluster"])
async def test_a_row_whose_expression_throws_costs_only_its_value(tmp_path: Path, spark: Any,
                                                                  output: str) -> None:

    stream = StreamConfig(name="clicks", table="web.clicks", columns=(
        *CLICKS.columns, Column("rx", "string", sql="regexp_extract(url, url, 0)"),
        Column("low", "string", sql="lower(url)")))
    config = collector_config(tmp_path, (stream, BUYS), output=output)
    store = open_store_of(config)
    await publish(store, [clicks("a", 40, bad=17) + [buy(i) for i in range(3)],
                          clicks("b", 5)])
    await store.close()
    collector = await collect_all(config, output_engine(spark, output))
    rows = {r["_event_id"]: r for r in read_table(config, "web.clicks").to_pylist()}
    assert set(rows) == ids("a", 40) | ids("b", 5)
    assert rows["a17"]["rx"] is None
    assert rows["a17"]["low"] == "("
    assert all(r["rx"] == r["url"] == r["low"] for k, r in rows.items() if k != "a17")
    assert_exact(config, "shop.buys", ids("b", 3))
    errors = collector.metrics.registry.get_sample_value(
        "icefloe_collector_sql_errors_total", {"stream": "clicks", "column": "rx"})
    assert errors == 1
    assert collector.metrics.registry.get_sample_value(
        "icefloe_collector_sql_errors_total", {"stream": "clicks", "column": "low"}) is None


def test_a_column_failing_on_every_row_is_bounded_and_null(tmp_path: Path, spark: Any) -> None:
    """Bisection has a budget: an expression that throws on every row costs its column's
    values for the run after a bounded number of Spark evaluations, never the run."""
    import pyarrow as pa

    from pipeline.load.mapped import fill_sql_safely

    base = pa.table({"_stream": ["s"] * 64, "_sequence": pa.array([1] * 64, pa.int64()),
                     "s0__url": ["("] * 63 + ["/ok"], "s0__rx": pa.nulls(64, pa.string())})
    out, errors = fill_sql_safely(spark, base, {
        "s0__rx": "CASE WHEN `_stream` = 's' THEN regexp_extract(s0__url, s0__url, 0) END"},
        max_probes=6)
    assert errors["s0__rx"] >= 63
    assert out.column("s0__rx").null_count >= 63
    assert out.column("s0__url").to_pylist() == base.column("s0__url").to_pylist()


AMPLIFIED = [  # #36: each multiplies its input; nested or per element they asked for GBs
    ("regexp_replace(regexp_replace(url, 'x', '0123456789012345678901234567890123456789'),"
     " 'x', '0123456789012345678901234567890123456789')", "function regexp_replace"),
    ("aggregate(split(url, ''), url, (acc, x) -> concat(acc, acc))",
     "uses its accumulator acc more than once per element"),
    ("transform(split(url, ''), x -> url)", "function transform"),
    ("concat_ws(url, split(url, ''))", "function concat_ws"),
    ("array_insert(array(1), 2000000000, 1)", "function array_insert"),
    ("array_insert(array(1), n, 1)", "function array_insert needs a literal position"),
    ("format_number(n, 2000000000)", "function format_number"),
    ("format_number(n, n)", "function format_number needs literal decimal places"),
]


@pytest.mark.parametrize(("sql", "expected"), AMPLIFIED)
def test_a_mapping_whose_value_can_outgrow_its_input_is_refused_at_load(
        tmp_path: Path, sql: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write_mapping(tmp_path, sql))
    assert expected in str(info.value)
    assert "bounded" in str(info.value) or "literal" in str(info.value)


@pytest.mark.parametrize("sql", [
    "regexp_replace(url, 'a', 'bb')", "concat(url, url, url, url)",
    "array_join(split(url, ','), ';')", "transform(split(url, ','), x -> concat(x, '-x'))",
    "aggregate(split(url, ','), '', (acc, x) -> concat(acc, x))", "format_number(n, 2)",
    "to_json(named_struct('a', url, 'b', n))", "concat_ws(',', url, 'a', 'b')"])
def test_a_mapping_bounded_by_its_input_is_accepted(tmp_path: Path, sql: str) -> None:
    load_config(write_mapping(tmp_path, sql))


def test_the_admin_api_refuses_an_amplifying_mapping_with_json_naming_it(
        admin: Admin) -> None:  # noqa: F811
    sql, expected = AMPLIFIED[0]
    reply = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "x", "table": "a.x", "columns": [
            {"name": "url", "type": "string"}, {"name": "bad", "type": "string", "sql": sql}]})
    assert reply.status_code == 400, reply.text
    [detail] = reply.json()["details"]
    assert detail["field"] == "sink.columns[1] (bad)"
    assert expected in detail["reason"]
