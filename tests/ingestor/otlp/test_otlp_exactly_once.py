"""Exactly once for OTLP exports whose answers were lost (issue #41, part 3).

The SDK's real exporters send through proxies that cut the first answer of each signal
*after* the ingestor made the request durable (:mod:`answer_proxy`); the exporter sees a
connection error, retries the same bytes, and reports SUCCESS. The batch files then hold
every row twice under identical ids (``otlp:<kind>:<sha256 of the body>:<i>``), and the
real collector (Spark, one run) commits each row to its Iceberg table once: its dedup
window (``collector.dedup_window_s``) keys on those ids.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.compute as pc
import pytest
from answer_proxy import AnswerDropProxy
from collector_support import collect_all, collector_config, read_table
from ingest_support import TOKEN, TOKEN_HASH
from otel_sdk import exporters, record
from otlp_support import otlp_config, stored_rows
from security_support import ingestor

from icefloe.config import Config
from icefloe.otlp.config import OtlpSection, with_otlp_streams
from pipeline.load.run import SparkEngine

SIGNALS = ("logs", "traces", "metrics")
EXPECTED = {"otlp.logs": 3, "otlp.spans": 4, "otlp.sum": 1, "otlp.gauge": 1,
            "otlp.histogram": 1, "otlp.exponential_histogram": 1}
"""Rows of ``record(logs=3, spans=2)``: a span has a child, each instrument one point."""


async def export_through_proxies(transport: str, port: int, telemetry: Any,
                                 ) -> tuple[tuple[str, ...], list[AnswerDropProxy]]:
    """Each signal through its own proxy that loses the first answer; the results."""
    async with contextlib.AsyncExitStack() as stack:
        proxies = [await stack.enter_async_context(
            AnswerDropProxy(port, http2=transport == "grpc")) for _ in SIGNALS]
        results = await asyncio.to_thread(_export_each, transport, proxies, telemetry)
    return results, proxies


def _export_each(transport: str, proxies: list[AnswerDropProxy], telemetry: Any
                 ) -> tuple[str, ...]:
    results = []
    data = (telemetry.logs, telemetry.spans, telemetry.metrics)
    for index, proxy in enumerate(proxies):
        endpoint = f"http://127.0.0.1:{proxy.port}" if transport == "http" \
            else f"127.0.0.1:{proxy.port}"
        exporter = exporters(transport, endpoint, TOKEN, timeout=30)[index]
        try:
            results.append(exporter.export(data[index]).name)
        finally:
            exporter.shutdown()
    return tuple(results)


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_should_store_a_retried_export_under_the_same_ids(tmp_path, transport):
    config = otlp_config(tmp_path / "store")
    async with ingestor(config) as ports:
        port = ports.http if transport == "http" else ports.grpc
        results, proxies = await export_through_proxies(transport, port, record())
    assert results == ("SUCCESS",) * 3
    assert [proxy.stats.cut for proxy in proxies] == [1, 1, 1]
    rows = await stored_rows(config)
    assert {stream: len(found) for stream, found in rows.items()} == {
        stream: 2 * count for stream, count in EXPECTED.items()}
    for stream, found in rows.items():
        ids = Counter(event_id for event_id, _ in found)
        assert set(ids.values()) == {2}, f"{stream}: every id twice, identical rows"
        first, second = found[:len(found) // 2], found[len(found) // 2:]
        assert first == second


def collected_config(tmp_path: Path) -> Config:
    """The collector's config (SQLite catalog, file warehouse) with ``[otlp]`` on, and an
    ingestor on 127.0.0.1 over the same store."""
    section = OtlpSection(enabled=True, tokens=(TOKEN_HASH,))
    config = collector_config(tmp_path, with_otlp_streams((), section, "test"))
    return msgspec.structs.replace(config, otlp=section, ingestor=msgspec.structs.replace(
        config.ingestor, host="127.0.0.1", http_port=0, grpc_port=0))


async def test_should_commit_retried_exports_once_into_iceberg(tmp_path: Path, spark: Any
                                                              ) -> None:
    """End to end: HTTP exports with lost answers (stored twice) and gRPC exports of other
    telemetry, then one collector run: every table holds each row once."""
    config = collected_config(tmp_path)
    async with ingestor(config) as ports:
        results, _ = await export_through_proxies("http", ports.http, record(tag="h"))
        direct, _ = await export_through_proxies("grpc", ports.grpc, record(tag="g"))
    assert results + direct == ("SUCCESS",) * 6
    stored = {stream: len(found) for stream, found in (await stored_rows(config)).items()}
    assert stored == {stream: 4 * count for stream, count in EXPECTED.items()}
    await collect_all(config, SparkEngine(spark, 2))
    for stream in config.streams:
        if stream.name not in EXPECTED:
            continue
        table = read_table(config, stream.table)
        assert table.num_rows == 2 * EXPECTED[stream.name], stream.table
        assert pc.count_distinct(table.column("_event_id")).as_py() == table.num_rows
    logs = read_table(config, "otel.logs")
    assert sorted(logs.column("body").to_pylist()) == sorted(
        f"payment failed {tag}{i}" for tag in "hg" for i in range(3))
    spans = read_table(config, "otel.spans")
    assert set(spans.column("service_name").to_pylist()) == {"checkout"}
