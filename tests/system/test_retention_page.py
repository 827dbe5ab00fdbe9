"""docs/retention.md's commands, run in order as the page gives them: a pageviews stream
with retention on, batches committed and dequeued (the in-process engine), the collector
stopped; then ``icefloe replay --help`` and a replay with ``--truncate`` (on Spark) that
leaves the table with exactly the rows it had. ``tests/system/test_readme_commands.py``
maps the page to this test."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from collector_support import drain, open_store_of, publish, read_table, start
from process_support import child_env

from icefloe.config import Column, StreamConfig, load_config
from pipeline.load.run import LocalEngine

ROOT = Path(__file__).resolve().parents[2]
PAGEVIEWS = StreamConfig(name="pageviews", table="web.pageviews", columns=(
    Column("user_id", "string"), Column("url", "string")))


def page_commands() -> list[str]:
    text = (ROOT / "docs" / "retention.md").read_text()
    return [" ".join(shlex.split(line, comments=True))
            for block in re.findall(r"```sh\n(.*?)```", text, re.S)
            for line in block.splitlines() if shlex.split(line, comments=True)]


def write_config(root: Path) -> Path:
    path = root / "icefloe.toml"
    path.write_text(f"""
[store]
url = "{(root / 'store').as_uri()}"
[catalog]
uri = "sqlite:///{root / 'catalog.db'}"
warehouse = "{(root / 'warehouse').as_uri()}"
[collector]
keep_batches_s = 3600
spark_driver_memory = "1g"
[[streams]]
name = "pageviews"
table = "web.pageviews"
columns = [{{name = "user_id", type = "string"}}, {{name = "url", type = "string"}}]
""")
    return path


async def commit(config: object) -> None:
    store = open_store_of(config)  # type: ignore[arg-type]
    try:
        await publish(store, [[("pageviews", f"p{b}-{i}", 1_795_400_000_000 + i,
                                b'{"user_id":"u%d","url":"/p/%d"}' % (i, b))
                               for i in range(5)] for b in range(4)])
    finally:
        await store.close()
    collector = await start(config, LocalEngine())
    try:
        await drain(collector)
        await collector.dequeue()
        await collector.consumer.release_lease()
    finally:
        await collector.store.close()


def test_retention_page_commands(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    asyncio.run(commit(config))
    before = read_table(config, "web.pageviews").sort_by("_event_id").to_pylist()
    env = {**child_env(), "ICEFLOE_CONFIG": str(tmp_path / "icefloe.toml"),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                    os.environ.get("PATH", "")])}
    helped, replayed = page_commands()
    done = subprocess.run(["bash", "-c", helped], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "--truncate" in done.stdout
    done = subprocess.run(["bash", "-c", replayed], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "20 rows committed" in done.stdout
    assert "replay 4/4 files (100%)" in done.stderr
    assert read_table(config, "web.pageviews").sort_by("_event_id").to_pylist() == before
