"""A hot standby: how soon commits resume after the active collector dies, or after a
``--takeover``, measured from events (the manifest's lease, the log, Iceberg snapshots).

Targets (issue #28): within ``lease_s`` + 5 s of the active collector's last renewal when it
is killed with ``kill -9`` and a standby waits; within 5 s of the epoch bump of a
``--takeover`` (the taking-over collector starts Spark *before* it bumps the epoch).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pyarrow.compute as pc
import pytest
from collector_support import click, open_store_of, publish_sync, read_table
from process_support import SPARK_TIMEOUT_S, Child, table_rows, wait_for, write_config

from icefloe.config import Config, load_config
from icefloe.manifest.cas import load
from pipeline.iceberg.catalog import open_catalog

ROOT = Path(__file__).resolve().parents[2]
RESUME_S = 5.0
"""The budget after the lease lapses (or after a takeover's epoch bump)."""


def env() -> dict[str, str]:
    from process_support import child_env

    return {**child_env(), "PYTHONPATH": str(ROOT)}  # this checkout's code


def last_renewal(config: Config) -> float:
    """When the (dead) holder last renewed: its lease's expiry minus ``lease_s``."""
    async def read() -> float:
        store = open_store_of(config)
        try:
            loaded = await load(store, config.manifest.key)
        finally:
            await store.close()
        return loaded.manifest.consumer.lease_expires_at - config.manifest.lease_s
    return asyncio.run(read())


def first_commit_s(config: Config, table: str, epoch: int) -> float | None:
    """Wall time of the first snapshot of ``epoch`` that added rows (fences add none)."""
    snapshots = open_catalog(config.catalog).load_table(table).snapshots()
    times = [s.timestamp_ms / 1000 for s in snapshots
             if s.summary is not None and s.summary.get("icefloe.epoch") == str(epoch)
             and int(s.summary.get("added-records") or 0) > 0]
    return min(times) if times else None


def log_time(path: Path, phrase: str) -> float:
    """The ``ts`` of the first JSON log line of ``path`` whose message holds ``phrase``."""
    from datetime import datetime

    for line in path.read_text(errors="replace").splitlines():
        if phrase in line and line.startswith("{"):
            ts = json.loads(line)["ts"]
            return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                tzinfo=__import__("datetime").timezone.utc).timestamp()
    raise AssertionError(f"no log line with {phrase!r} in {path}")


def wait_log(path: Path, phrase: str, timeout: float = SPARK_TIMEOUT_S) -> None:
    wait_for(lambda: phrase in path.read_text(errors="replace"), timeout,
             f"{phrase!r} in {path.name}")


def batches(start: int, count: int = 2, size: int = 25) -> list[list]:
    return [[click(i) for i in range(k, k + size)]
            for k in range(start, start + count * size, size)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_should_resume_commits_soon_after_a_kill_and_after_a_takeover(tmp_path):
    path = write_config(tmp_path)
    text = path.read_text().replace("lease_s = 2.0", "lease_s = 6.0")
    path.write_text(text)
    config = load_config(path)
    lease_s = config.manifest.lease_s
    logs = {name: tmp_path / f"{name}.log" for name in ("active", "standby", "takeover")}
    active = Child(["collector", "--config", str(path)], tmp_path, logs["active"], env())
    standby = takeover = None
    try:
        first = active.ready()
        standby = Child(["collector", "--config", str(path)], tmp_path, logs["standby"], env())
        wait_log(logs["standby"], "standby: warm")  # Spark, store and catalog checked
        publish_sync(config, batches(0))
        wait_for(lambda: table_rows(config, "web.clicks") == 50, SPARK_TIMEOUT_S, "50 rows")

        active.proc.kill()  # kill -9: the lease stays "live" until it lapses
        assert active.proc.wait(30) == -signal.SIGKILL
        renewed = last_renewal(config)
        publish_sync(config, batches(50))
        second = standby.ready()
        assert second["epoch"] > first["epoch"]
        wait_for(lambda: table_rows(config, "web.clicks") == 100, SPARK_TIMEOUT_S,
                 "100 rows after the failover")
        resumed = first_commit_s(config, "web.clicks", second["epoch"])
        assert resumed is not None
        failover_s = resumed - renewed
        print(f"\nfailover: first commit {failover_s:.2f} s after the last renewal "
              f"(lease_s {lease_s:g}, target {lease_s + RESUME_S:g})")

        takeover = Child(["collector", "--config", str(path), "--takeover"], tmp_path,
                         logs["takeover"], env())
        third = takeover.ready()
        assert standby.proc.wait(60) == 3  # fenced
        publish_sync(config, batches(100))
        wait_for(lambda: table_rows(config, "web.clicks") == 150, SPARK_TIMEOUT_S,
                 "150 rows after the takeover")
        bumped = log_time(logs["takeover"], f"at epoch {third['epoch']} (takeover)")
        taken = first_commit_s(config, "web.clicks", third["epoch"])
        assert taken is not None
        takeover_s = taken - bumped
        print(f"takeover: first commit {takeover_s:.2f} s after the epoch bump "
              f"(target {RESUME_S:g})")
        assert failover_s <= lease_s + RESUME_S
        assert takeover_s <= RESUME_S
        assert takeover.stop(signal.SIGTERM) == 0
    finally:
        for child in (active, standby, takeover):
            if child is not None:
                child.close()
    rows = read_table(config, "web.clicks")
    assert (rows.num_rows, len(pc.unique(rows.column("_event_id")))) == (150, 150)


def test_should_outlive_a_store_outage_while_waiting_and_take_over(tmp_path):
    """A standby whose lease reads fail (the store down longer than its own retries)
    waits on and takes over once the lease lapses, instead of exiting and leaving no
    collector until a new process boots Spark."""
    from collector_support import collector_config, open_store_of

    from collector.service import Collector
    from icefloe.store.faults import FaultRule, FaultyAsyncStore
    from pipeline.iceberg.catalog import open_catalog
    from pipeline.load.run import LocalEngine

    config = collector_config(tmp_path)  # lease_s 2

    async def go() -> tuple[int, int, int]:
        holder = Collector(config, open_store_of(config), open_catalog(config.catalog),
                           LocalEngine())
        first = await holder.acquire(takeover=True)  # then never renewed: it lapses
        faulty = FaultyAsyncStore(open_store_of(config),
                                  [FaultRule("fail", ops=frozenset({"get"}), times=3)])
        standby = Collector(config, faulty, open_catalog(config.catalog), LocalEngine())
        second = await asyncio.wait_for(standby.acquire(takeover=False, wait=True), 60)
        await holder.store.close()
        await faulty.close()
        return first, second, faulty.injected["fail"]

    first, second, failed = asyncio.run(go())
    assert failed == 3
    assert second == first + 1
