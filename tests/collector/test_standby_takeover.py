"""A warm standby takes the queue within a bound after the active collector dies, and
commits at once: two real ``run_collector``s (the start-up ``icefloe collector`` and
``icefloe up`` run), a real local store and SQLite catalog, decode in-process (no Spark:
``tests/collector/test_standby.py`` times the Spark path with two processes).

Every step is awaited as an event (``ready`` of each collector, the standby's warm pass,
the hook after a run's commits), never slept for: the bound asserted is the lease plus the
standby's poll slack, from the dead collector's last renewal (read from the manifest).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from collector.runner import Ready, run_collector
from icefloe.config import Config
from icefloe.manifest.cas import load
from pipeline.load.run import LocalEngine
from tests.collector_support import (
    assert_exact,
    click,
    collector_config,
    ids,
    open_store_of,
    publish_sync,
)

TAKEOVER_SLACK_S = 2.0
"""Beyond the lease: the standby sleeps until the lease's expiry, then bumps the epoch and
prepares its tables (a few catalog reads and empty commits here)."""
FIRST_COMMIT_S = 3.0
"""From the standby's ``ready`` to its first commit of what was queued meanwhile."""


async def last_renewal(config: Config) -> float:
    """When the (dead) holder last renewed: its lease's expiry minus ``lease_s``."""
    store = open_store_of(config)
    try:
        loaded = await load(store, config.manifest.key)
    finally:
        await store.close()
    return loaded.manifest.consumer.lease_expires_at - config.manifest.lease_s


class Started:
    """One ``run_collector`` as a task, with its moments as events."""

    def __init__(self, config: Config, *, takeover: bool = False) -> None:
        self.stop = asyncio.Event()
        self.ready = asyncio.Event()
        self.committed = asyncio.Event()
        self.ready_at = self.committed_at = 0.0
        self.epoch = 0
        self.task = asyncio.create_task(run_collector(
            config, stop=self.stop, engine=LocalEngine(), serve_metrics=False,
            on_ready=self._ready, hook=self._hook, takeover=takeover))

    def _ready(self, info: Ready) -> None:
        self.ready_at, self.epoch = time.time(), info.epoch
        self.ready.set()

    def _hook(self, stage: str) -> None:
        if stage == "after_commits" and not self.committed.is_set():
            self.committed_at = time.time()
            self.committed.set()


async def test_should_take_the_queue_within_the_lease_and_commit_at_once(tmp_path: Path):
    config = collector_config(tmp_path, commit_interval_s=0.1, poll_interval_s=0.1)
    lease_s = config.manifest.lease_s
    publish_sync(config, [[click(i) for i in range(10)]])
    active = Started(config)
    await asyncio.wait_for(active.ready.wait(), 60)
    await asyncio.wait_for(active.committed.wait(), 30)
    standby = Started(config)
    try:
        # it waits on the lease, warm (the real StandbyWarmth: catalog checked)
        killed_at = time.time()
        active.task.cancel()  # the process dies: no lease release, renewal stops
        await asyncio.gather(active.task, return_exceptions=True)
        renewed = await last_renewal(config)
        await asyncio.to_thread(publish_sync, config, [[click(i) for i in range(10, 30)]])
        await asyncio.wait_for(standby.ready.wait(), lease_s + TAKEOVER_SLACK_S + 30)
        await asyncio.wait_for(standby.committed.wait(), FIRST_COMMIT_S + 30)
        assert standby.epoch > active.epoch
        assert standby.ready_at >= killed_at  # it waited while the active one lived
        took = standby.ready_at - renewed
        first = standby.committed_at - standby.ready_at
        print(f"\ntakeover {took:.2f} s after the last renewal (lease_s {lease_s:g}); first "
              f"commit {first:.2f} s after ready")
        assert took <= lease_s + TAKEOVER_SLACK_S
        assert first <= FIRST_COMMIT_S
    finally:
        standby.stop.set()
        await asyncio.gather(standby.task, return_exceptions=True)
    assert_exact(config, "web.clicks", ids("c", 30))


async def test_should_fence_the_active_one_with_a_takeover_and_commit_at_once(tmp_path: Path):
    """``--takeover``: warms (its pass before the bump), fences the active collector, which
    exits 3 without committing more, and commits what was queued meanwhile."""
    config = collector_config(tmp_path, commit_interval_s=0.1, poll_interval_s=0.1)
    publish_sync(config, [[click(i) for i in range(10)]])
    active = Started(config)
    await asyncio.wait_for(active.ready.wait(), 60)
    await asyncio.wait_for(active.committed.wait(), 30)
    await asyncio.to_thread(publish_sync, config, [[click(i) for i in range(10, 30)]])
    taking = Started(config, takeover=True)
    try:
        await asyncio.wait_for(taking.ready.wait(), 60)
        assert await asyncio.wait_for(active.task, 30) == 3  # fenced
        await asyncio.wait_for(taking.committed.wait(), FIRST_COMMIT_S + 30)
        assert taking.epoch > active.epoch
        assert taking.committed_at - taking.ready_at <= FIRST_COMMIT_S
    finally:
        for started in (active, taking):
            started.stop.set()
        await asyncio.gather(active.task, taking.task, return_exceptions=True)
    assert_exact(config, "web.clicks", ids("c", 30))


def test_should_retry_a_start_up_only_through_a_passing_failure() -> None:
    """After its epoch bump a collector retries preparing through a store or catalog
    failure (a standby taking over in a store outage must not exit and leave no collector),
    never through a fence, a lost offset or a bad configuration."""
    from collector.runner import _transient
    from icefloe.errors import (
        ConfigError,
        FencedError,
        ManifestMismatchError,
        TransientStoreError,
    )

    assert _transient(TransientStoreError("injected slowdown on get 'dedup/x'"))
    assert _transient(ConnectionError("reset"))
    wrapped = RuntimeError("commit gave up")
    wrapped.__cause__ = TransientStoreError("503")
    assert _transient(wrapped)
    for refused in (FencedError(2, 3), ManifestMismatchError("reset manifest"),
                    ConfigError("bad key"), ValueError("a bug")):
        assert not _transient(refused), refused
