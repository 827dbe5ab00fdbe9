"""The "Coming from …" pages' rows, typed as their users would (issue #37).

Moose's ``Key`` orders a table and, with a replacing engine, the newest row per key wins: a
record re-sent with the same key and new content *replaces* the old one. The README mapped it
to ``event_id_field`` first, which acknowledges that re-send and drops it inside the dedup
window. The test reads the row's first setting from ``docs/coming-from/moose.md``, so the
page and the behaviour cannot drift apart; the real ingestor (HTTP) and collector (local
engine) run on a real SQLite catalog.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from collector_support import collect_all, collector_config, read_table
from ingest_support import http_serving, running

from icefloe.config import Column, StreamConfig
from pipeline.load.run import LocalEngine

ROOT = Path(__file__).resolve().parents[2]


def page_row(page: str, first_cell: str) -> str:
    """The icefloe cell of the row starting with ``first_cell`` in ``docs/coming-from/PAGE``'s
    mapping table."""
    text = (ROOT / "docs" / "coming-from" / page).read_text()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells[1]
    raise AssertionError(f"no row {first_cell!r} in {page}")


def users(setting: str) -> StreamConfig:
    """A Moose-style data model ``User { id: Key<string>; name: string }`` as the README's
    mapping of ``Key`` turns it into a stream."""
    columns = (Column("id", "string", required=True), Column("name", "string"))
    if setting == "primary_key":
        return StreamConfig(name="users", table="app.users", columns=columns,
                            primary_key=("id",), partition="none")
    assert setting == "event_id_field", setting
    return StreamConfig(name="users", table="app.users", columns=columns,
                        event_id_field="id", partition="none")


async def resend(tmp_path: Path, stream: StreamConfig) -> list[dict[str, Any]]:
    """``POST /ingest/users`` a record, collect, re-send it with the same key and new
    content, collect: the table's rows."""
    config = collector_config(tmp_path, streams=(stream,))
    for record in ({"id": "u1", "name": "Ada"}, {"id": "u1", "name": "Ada Lovelace"}):
        async with running(config) as runtime, http_serving(runtime) as url, \
                httpx.AsyncClient(base_url=url) as client:
            reply = await client.post("/ingest/users", json=record)
            assert reply.status_code == 202, reply.text
        await collect_all(config, LocalEngine())
    return read_table(config, "app.users").select(["id", "name"]).to_pylist()


async def test_moose_key_maps_to_primary_key_and_the_new_content_wins(tmp_path: Path) -> None:
    row = page_row("moose.md", "`Key` on a model field")
    first = re.search(r"`(\w+)", row)
    assert first is not None
    assert first.group(1) == "primary_key", row
    assert await resend(tmp_path, users(first.group(1))) == [
        {"id": "u1", "name": "Ada Lovelace"}]


async def test_event_id_field_is_for_retries_of_the_same_event(tmp_path: Path) -> None:
    """What the row says ``event_id_field`` is for: a re-send with the same id is a retry,
    acknowledged and dropped inside the dedup window, so new content under an old id is
    lost: never the mapping of a key whose rows change."""
    row = page_row("moose.md", "`Key` on a model field")
    assert "event_id_field" in row
    assert "same event" in row
    assert await resend(tmp_path, users("event_id_field")) == [{"id": "u1", "name": "Ada"}]
