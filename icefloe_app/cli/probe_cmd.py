"""``icefloe probe``: check that a store enforces conditional writes before trusting it, and
time the durable PUTs every flush is made of."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from icefloe.store import local_path, open_async_store
from icefloe.store.fs_kind import journalless_note
from icefloe.store.probe import PROBE_PUT_BYTES, measure_puts, probe_conditional_writes
from icefloe_app.cli.arg_types import whole_number
from icefloe_app.cli.common import add_store_arguments, resolve_store, store_options


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "probe", help="check that an object store enforces conditional writes",
        description="Write, conflict and delete a probe object under _icefloe/probe/ to "
                    "prove the store answers a conflicting conditional PUT with 412. Every "
                    "icefloe process runs this check at start; run it by hand when "
                    "evaluating a new S3-compatible store. Then time --puts durable PUTs "
                    "of a small batch file's size, one after the other: every flush writes "
                    "a batch file and then the manifest, so this is the floor under every "
                    "acknowledgement (a local store's directory that creates files slowly "
                    "shows here; on ext4 without a journal, a note says why).")
    add_store_arguments(parser)
    parser.add_argument("--puts", type=whole_number("--puts"), default=20, metavar="N",
                        help="how many PUTs to time after the check (default 20; 0: none)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    resolve_store(args)

    async def probe() -> None:
        store = open_async_store(args.store, store_options(args),
                                 control_url=getattr(args, "control_store", None))
        try:
            await probe_conditional_writes(store)
            print(f"ok: {args.store} enforces If-None-Match and If-Match (conditional "
                  "writes)", flush=True)
            if args.puts:
                timed = await measure_puts(store, args.puts)
                print(f"puts: p50 {timed.p50_s * 1000:.2f} ms, p99 {timed.p99_s * 1000:.2f} "
                      f"ms over {timed.count} PUTs of {PROBE_PUT_BYTES // 1024} KiB (a flush "
                      "makes two in a row: its batch file, then the manifest)")
            if args.store.startswith("file:") and (
                    note := journalless_note(local_path(args.store))):
                print(f"note: {note}")
        finally:
            await store.close()

    asyncio.run(probe())
    return 0
