"""A lease renewal that lands late is said (a warning with what was late), so a post-mortem of
a standby that took over a healthy collector tells a starved process from a slow store."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from collector.runner import Runner
from pipeline.load.run import LocalEngine
from tests.collector_support import collector_config, start


async def test_a_late_renewal_is_warned_about_with_its_parts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    collector = await start(collector_config(tmp_path), LocalEngine())
    runner = Runner(collector, asyncio.Event())
    now = runner.clock.monotonic()
    with caplog.at_level(logging.WARNING, logger="icefloe.collector"):
        on_time = runner._renewed(now - 1.0, now - 0.05, 3.0)  # a third of the lease: fine
        assert not caplog.records
        late = runner._renewed(now - 2.5, now - 0.3, 3.0)
    assert late >= now
    assert on_time >= now
    [record] = caplog.records
    message = record.getMessage()
    assert "lease renewed 2.5 s after the last renewal (lease 3.0 s" in message
    assert "began 1.2 s late and took 0.3 s" in message
    await collector.store.close()
