"""Configs and read-backs for the OTLP receiver tests."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
from ingest_support import PAGEVIEWS, TOKEN_HASH, make_config, stored_events

from icefloe.config import Config
from icefloe.otlp.config import OtlpSection, with_otlp_streams


def otlp_config(store_dir: Path, *, tokens: tuple[str, ...] = (TOKEN_HASH,),
                otlp: dict[str, Any] | None = None, **ingestor: Any) -> Config:
    """A config with ``[otlp]`` on (its streams generated as the loader does), a token for
    every OTLP stream, and ``ingestor`` overrides (e.g. ``otlp_http_port=0``)."""
    base = make_config(store_dir, (PAGEVIEWS,), **ingestor)
    section = OtlpSection(enabled=True, tokens=tokens, **(otlp or {}))
    return msgspec.structs.replace(base, otlp=section,
                                   streams=with_otlp_streams(base.streams, section, "test"))


async def stored_rows(config: Config) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every stored event per stream: (event id, its row), in store order."""
    rows: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for envelope in await stored_events(config.store.url):
        rows[envelope.stream].append((envelope.event_id, json.loads(envelope.payload)))
    return dict(rows)
