"""opendata's opaque entries in a table (#37): a ``payload = "bytes"`` stream's entries land
in its ``binary`` column byte for byte, from batch files of either codec (``batch_compression
= "zstd"`` and ``"none"`` in one queue). In-process ingestor, real collector (local engine),
SQLite catalog, local store."""

from __future__ import annotations

from pathlib import Path

import msgspec
from collector_support import collect_all, collector_config, read_table

from icefloe.config import Column, StreamConfig
from ingestor.embed import Ingestor
from pipeline.load.run import LocalEngine

ENTRIES = StreamConfig(name="entries", table="buffer.entries", payload="bytes",
                       partition="none", columns=(Column("entry", "binary", required=True),))


async def test_entries_land_byte_for_byte_from_both_codecs(tmp_path: Path) -> None:
    config = collector_config(tmp_path, streams=(ENTRIES,))
    plain = msgspec.structs.replace(config, ingestor=msgspec.structs.replace(
        config.ingestor, batch_compression="none"))
    sent = [b"\x00\xff", b"two\nlines\r\n", b"", bytes(range(256))]
    async with await Ingestor.open(config) as ingestor:
        assert await ingestor.ingest(sent[:2]) == 2
    async with await Ingestor.open(plain) as ingestor:
        assert await ingestor.ingest(sent[2:]) == 2
    await collect_all(config, LocalEngine())
    table = read_table(config, "buffer.entries")
    assert str(table.schema.field("entry").type) == "binary"
    assert sorted(table.column("entry").to_pylist()) == sorted(sent)
