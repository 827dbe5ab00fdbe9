"""Shared plumbing for icefloe benchmarks: hardware facts, result rows, table and JSON output,
the ``--quick``/``--json`` command line, and the local lake most benchmarks build (a config
on a local store and a SQLite catalog, a manifest filled with batch files, a collector
draining it).

Every benchmark prints a readable table and, with ``--json PATH``, writes
``{"hardware": {...}, "results": [{"name", "value", "unit", "baseline", "ratio"}, ...]}``
so runs on different machines can be compared.

The project imports are inside the functions that need them: the light benchmarks (queue,
ingest) import this module too and should not pay for the collector's imports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collector.service import Collector, Engine
    from icefloe.config import Config, StreamConfig
    from icefloe.manifest import Entry
    from icefloe.store.base import AsyncObjectStore


@dataclass
class Result:
    """One measured figure and the baseline it was measured against in the same run."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None

    def __post_init__(self) -> None:
        if self.baseline and self.ratio is None:
            self.ratio = round(self.value / self.baseline, 3)


def hardware() -> dict[str, object]:
    """What the numbers ran on."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gib = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib,
            "python": sys.version.split()[0], "platform": platform.platform()}


def print_table(title: str, results: list[Result]) -> None:
    print(f"\n{title}")
    headers = ["benchmark", "value", "unit", "baseline", "ratio"]
    rows = [[r.name, f"{r.value:,.1f}", r.unit,
             "" if r.baseline is None else f"{r.baseline:,.1f}",
             "" if r.ratio is None else f"{r.ratio:.2f}"] for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))


CODE = ("icefloe", "icefloe_app", "ingestor", "collector", "pipeline", "testing",
        ":(glob)bench/*.py", "pyproject.toml", "constraints.txt")
"""What a figure depends on: a change elsewhere (docs, tests) does not make a run dirty."""


def provenance() -> dict[str, object]:
    """When, how and from which commit a result file was measured: the docs render these
    beside every figure (scripts/gen_docs.py), so a reader can rerun the exact command.
    ``commit`` ends in ``+dirty`` when tracked files differed from it; ``load_1m`` is the
    1-minute load average when the run ended (other work on the machine moves figures)."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *CODE],
                               cwd=root, check=False, timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", False
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(root) if script.is_relative_to(root) else script
    return {"date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join([".venv/bin/python", str(shown), *sys.argv[1:]]),
            "commit": commit + ("+dirty" if dirty else ""),
            "load_1m": round(os.getloadavg()[0], 2)}


def write_json(path: str | None, results: list[Result]) -> None:
    """Write the results of record to ``path`` (nothing without one).

    Raises:
        SystemExit: a figure is NaN or infinite — a percentile of no samples, a rate over
            nothing — which the docs would render as if it were measured; the rows are named
            and nothing is written.
    """
    if not path:
        return
    unmeasured = [r.name for r in results
                  if any(v is not None and not math.isfinite(v)
                         for v in (r.value, r.baseline, r.ratio))]
    if unmeasured:
        raise SystemExit(f"not writing {path}: {len(unmeasured)} figure(s) are NaN or "
                         f"infinite, i.e. nothing was measured: {unmeasured[:5]}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({**provenance(), "hardware": hardware(),
                                      "results": [asdict(r) for r in results]}, indent=2)
                          + "\n")
    print(f"\nwrote {path}")


def bench_parser(doc: str | None, quick_help: str) -> argparse.ArgumentParser:
    """The command line every benchmark shares: ``--quick`` (what it shortens is
    ``quick_help``) and ``--json PATH``; a benchmark adds its own options to it."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    return parser


# -- a local lake: config, filled manifest, draining collector --------------------------------


def local_config(root: Path, streams: Iterable[StreamConfig] | None = None, *,
                 env: Mapping[str, str] | None = None, **collector: object) -> Config:
    """A config whose store (``root/store``), SQLite catalog and warehouse all live under
    ``root``, with ``collector`` settings as overrides and ``streams`` in place of the file's
    (none). ``env`` replaces the process environment when given (a reproducible run)."""
    import msgspec

    from icefloe.config import load_config

    root.mkdir(parents=True, exist_ok=True)
    (root / "icefloe.toml").write_text("")
    overrides: dict[str, dict[str, Any]] = {
        "store": {"url": (root / "store").as_uri()},
        "catalog": {"uri": f"sqlite:///{root / 'catalog.db'}",
                    "warehouse": (root / "warehouse").as_uri()}}
    if collector:
        overrides["collector"] = dict(collector)
    config = load_config(root / "icefloe.toml", overrides=overrides,
                         **({} if env is None else {"env": env}))
    if streams is None:
        return config
    return msgspec.structs.replace(config, streams=tuple(streams))


BatchFile = tuple[bytes, int, tuple[str, ...]]
"""A framed batch file, its record count and the streams in it (``build_batch``'s answer)."""


async def publish_files(store_url: str, files: Iterable[BatchFile]) -> None:
    """Write each batch file and append it to the manifest, as an ingestor's flush does;
    ``files`` may be a generator, so only one batch is in memory at a time."""
    from icefloe.manifest import ManifestProducer
    from icefloe.manifest.publish import publish_batch
    from icefloe.store import open_async_store

    store = open_async_store(store_url)
    producer = ManifestProducer(store)
    try:
        for data, count, streams in files:
            await publish_batch(store, producer, data, record_count=count, streams=streams)
    finally:
        await producer.close()
        await store.close()


Event = tuple[str, str, int, bytes]
"""(stream, event id, received at in ms, canonical payload): a record of a batch file."""


async def publish_every(store_url: str, seconds: float, batch_of: Callable[[int], list[Event]],
                        interval_s: float = 0.1) -> dict[int, tuple[float, int]]:
    """Publish ``batch_of(i)`` as the i-th batch file every ``interval_s`` for ``seconds``,
    as an ingestor's flushes do; each manifest sequence's (publish time, events).

    Meant for a process of its own (``asyncio.run`` it there): in a collector's process it
    would share the GIL with the collector's Python work and publish late exactly when that
    work grows."""
    from icefloe.manifest import ManifestProducer
    from icefloe.manifest.publish import build_batch, publish_batch
    from icefloe.store import open_async_store

    store = open_async_store(store_url)
    producer = ManifestProducer(store)
    published: dict[int, tuple[float, int]] = {}
    deadline, i = time.monotonic() + seconds, 0
    try:
        while time.monotonic() < deadline:
            tick = time.monotonic()
            data, count, streams = build_batch(batch_of(i))
            at = time.time()
            seq = await publish_batch(store, producer, data, record_count=count,
                                      streams=streams)
            assert seq is not None, "a fresh producer's append has a sequence"
            published[seq] = (at, count)
            i += 1
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - tick)))
    finally:
        await producer.close()
        await store.close()
    return published


async def manifest_entries(store_url: str) -> list[Entry]:
    """The manifest's entries as they stand (for a run spec without a collector)."""
    from icefloe.config.manifest import ManifestConfig
    from icefloe.manifest import load
    from icefloe.store import open_async_store

    store = open_async_store(store_url)
    try:
        return list((await load(store, ManifestConfig().key)).manifest.entries)
    finally:
        await store.close()


async def open_collector(config: Config, engine: Engine, **options: Any
                         ) -> tuple[Collector, AsyncObjectStore]:
    """A collector on ``config``'s store that holds the lease and has its tables ready; the
    caller closes the store."""
    from collector.service import Collector
    from icefloe.store import open_async_store
    from pipeline.iceberg.catalog import open_catalog

    store = open_async_store(config.store.url)
    collector = Collector(config, store, open_catalog(config.catalog), engine, **options)
    await collector.acquire(takeover=True)
    await asyncio.to_thread(collector.prepare_tables)
    return collector, store


async def drain(config: Config, engine: Engine, events: int, *, until_empty: bool = False
                ) -> tuple[float, Collector]:
    """Drain the pre-filled manifest (one run, or runs until it is empty when
    ``until_empty``) and check all ``events`` were committed; committed events/s, timed
    from the first run (lease and table setup excluded), and the collector (its metrics)."""
    collector, store = await open_collector(config, engine)
    committed = 0
    try:
        started = time.perf_counter()
        while (result := await collector.run_once()).entries:
            committed += sum(result.rows.values())
            if not until_empty:
                break
        seconds = time.perf_counter() - started
    finally:
        await store.close()
    assert committed == events, f"committed {committed} of {events}"
    return events / seconds, collector


def serve_announcing(config: Config) -> int:
    """Run an ingestor in this process and print the ``ready`` JSON line ``icefloe
    ingestor`` prints (the bench's ingestor variants, driven by a parent process)."""
    from ingestor import server

    def announce(ports: server.BoundPorts) -> None:
        print(json.dumps({"event": "ready", "http_port": ports.http, "grpc_port": ports.grpc}),
              flush=True)

    return server.run(config, on_ready=announce)
