"""``icefloe probe``: check that a store enforces conditional writes before trusting it."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from icefloe.store import open_async_store
from icefloe.store.probe import probe_conditional_writes
from icefloe_app.cli.common import add_store_arguments, resolve_store, store_options


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "probe", help="check that an object store enforces conditional writes",
        description="Write, conflict and delete a probe object under _icefloe/probe/ to "
                    "prove the store answers a conflicting conditional PUT with 412. Every "
                    "icefloe process runs this check at start; run it by hand when "
                    "evaluating a new S3-compatible store.")
    add_store_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    resolve_store(args)

    async def probe() -> None:
        store = open_async_store(args.store, store_options(args),
                                 control_url=getattr(args, "control_store", None))
        try:
            await probe_conditional_writes(store)
        finally:
            await store.close()

    asyncio.run(probe())
    print(f"ok: {args.store} enforces If-None-Match and If-Match (conditional writes)")
    return 0
