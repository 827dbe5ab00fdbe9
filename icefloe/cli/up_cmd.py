"""``icefloe up``: the whole cluster on one machine, on the embedded default.

Today it prepares the embedded data directory (local object store), proves the store
enforces conditional writes, and reports the manifest queue. The ingestor and collector
processes join it as they are built (see the README's status table).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from icefloe.manifest import ManifestConfig, load
from icefloe.store import open_async_store
from icefloe.store.probe import probe_conditional_writes

DEFAULT_DATA_DIR = "./icefloe-data"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "up", help="run icefloe on this machine on the embedded default",
        description="Prepare the embedded data directory (local object store under "
                    "DATA_DIR/store), check it, and report the queue.")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help="where the store, catalog and warehouse live "
                             "(default: %(default)s)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    store_dir = Path(args.data_dir).absolute() / "store"
    url = store_dir.as_uri()

    async def prepare() -> tuple[int, int]:
        store = open_async_store(url)
        await probe_conditional_writes(store)
        manifest = (await load(store, ManifestConfig().key)).manifest
        await store.close()
        return len(manifest.entries), manifest.next_sequence

    queued, next_sequence = asyncio.run(prepare())
    print(f"store     {url}  (conditional writes: ok)")
    print(f"manifest  {queued} queued entries, next sequence {next_sequence}")
    print("status    the batch-file store and manifest queue are ready; the HTTP/gRPC "
          "ingestor and the Iceberg collector are not built yet (see README, Status)")
    return 0
