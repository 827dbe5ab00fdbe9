"""``icefloe inspect manifest|batch``: print what is in the queue or in one batch file.

Why: when something looks stuck, an operator's first questions are "what is queued, who
consumes it, how far has it acked" and "what is inside this file". Both answers come
straight from the bytes, without a running cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from icefloe.checksum import crc32c
from icefloe.errors import BatchFormatError, NotFound
from icefloe.formats.batch import decode_block, iter_records, read_footer
from icefloe.formats.envelope import Envelope, decode_envelope
from icefloe.manifest import Loaded, Manifest, ManifestConfig, load
from icefloe.manifest.shards import read_shard_count, shard_key, shard_set_key
from icefloe.store import local_path, open_async_store, open_store
from icefloe_app.cli.common import (
    add_s3_arguments,
    add_store_arguments,
    iso,
    print_json,
    resolve_store,
    store_options,
    table,
)
from icefloe_app.cli.config_args import config_from_args


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "inspect", help="show the manifest queue or a batch file",
        description="Read the manifest queue or one batch file and print what is inside.")
    what = parser.add_subparsers(dest="what", metavar="WHAT", required=True)

    manifest = what.add_parser(
        "manifest", help="entries, epoch, consumer lease, producers (every shard)",
        description="Print the manifest, every shard of it: consumer epoch, holder and "
                    "lease, acked and next sequence, producers, and the queued entries "
                    "(oldest first).")
    add_store_arguments(manifest)
    manifest.add_argument("--key",
                          help="manifest object key, shard 0 (default: [manifest] key of the "
                               f"config, else {ManifestConfig().key})")
    manifest.add_argument("--limit", type=int, default=20,
                          help="entries to list in the table (default: %(default)s)")
    manifest.add_argument("--json", action="store_true", help="print JSON (all entries)")
    manifest.set_defaults(run=run_manifest)

    batch = what.add_parser(
        "batch", help="footer, record count and the first records of a batch file",
        description="Decode a batch file (a local path, file:// or s3:// URL), verify its "
                    "footer and framing, and print its envelope records.")
    batch.add_argument("location", metavar="PATH_OR_URL")
    add_s3_arguments(batch)
    batch.add_argument("--records", type=int, default=5,
                       help="records to print (default: %(default)s)")
    batch.add_argument("--json", action="store_true", help="print JSON")
    batch.set_defaults(run=run_batch)


# --- manifest ------------------------------------------------------------------------------

def run_manifest(args: argparse.Namespace) -> int:
    """Print every shard (shard 0 is ``--key``; the store's shard set says how many).

    JSON keeps shard 0's fields at the top level (what single-manifest tooling reads)
    and adds ``shard_count`` and ``shards``, one object per shard of the same shape."""
    resolve_store(args)
    if args.key is None:  # the config's [manifest] key, as the ingestors and collector use
        args.key = config_from_args(args, example=True)[1].manifest.key

    async def read() -> list[Loaded]:
        store = open_async_store(args.store, store_options(args),
                                 control_url=getattr(args, "control_store", None))
        try:
            count = await read_shard_count(store, args.key)
            return list(await asyncio.gather(*(load(store, shard_key(args.key, n))
                                               for n in range(count))))
        finally:
            await store.close()

    shards = asyncio.run(read())
    if shards[0].etag is None:
        raise NotFound(f"no manifest at {args.store} key {args.key!r}: nothing has been "
                       "ingested into this store yet (check --store and --key)")
    if args.json:
        views = [_shard_json(args, n, loaded) for n, loaded in enumerate(shards)]
        print_json({"store": args.store, **views[0], "shard_count": len(shards),
                    "shards": views})
        return 0
    if len(shards) == 1:
        print(_manifest_summary(args, args.key, shards[0].manifest, shards[0].size))
        return 0
    queued = sum(loaded.manifest.entry_count for loaded in shards)
    parts = [f"shards    {len(shards)} ({shard_set_key(args.key)}), {queued} entries queued "
             "in all"]
    for number, loaded in enumerate(shards):
        key = shard_key(args.key, number)
        parts.append(f"\n--- shard {number} ---")
        parts.append(_manifest_summary(args, key, loaded.manifest, loaded.size)
                     if loaded.etag is not None else f"manifest  {key}: not written yet")
    print("\n".join(parts))
    return 0


def _shard_json(args: argparse.Namespace, number: int, loaded: Loaded) -> dict[str, Any]:
    manifest = loaded.manifest
    return {"shard": number, "key": shard_key(args.key, number), "etag": loaded.etag,
            "bytes": loaded.size, "epoch": manifest.epoch, "revision": manifest.revision,
            "next_sequence": manifest.next_sequence,
            "first_sequence": manifest.first_sequence,
            "entry_count": len(manifest.entries), "consumer": manifest.consumer,
            "producers": manifest.producers, "entries": manifest.entries}


def _manifest_summary(args: argparse.Namespace, key: str, manifest: Manifest,
                      size: int) -> str:
    consumer, now = manifest.consumer, time.time()
    records = sum(e.record_count for e in manifest.entries)
    lease = (f"expires in {consumer.lease_expires_at - now:.1f}s"
             if consumer.lease_expires_at > now else "lapsed")
    lines = [
        f"manifest  {args.store} / {key}  ({size:,} bytes, revision {manifest.revision})",
        f"consumer  epoch {manifest.epoch}, holder {consumer.holder or '-'}, lease {lease}, "
        f"acked through {consumer.acked_through}",
        f"queue     {len(manifest.entries)} entries ({records:,} records), sequences "
        f"{manifest.first_sequence}..{manifest.next_sequence - 1}, next {manifest.next_sequence}",
        f"producers {len(manifest.producers)}",
    ]
    shown = manifest.entries[: max(args.limit, 0)]
    if shown:
        rows = [[str(e.sequence), f"{e.record_count:,}", f"{e.size:,}", ",".join(e.streams),
                 iso(e.ingested_at), e.location] for e in shown]
        lines += ["", table(["SEQ", "RECORDS", "BYTES", "STREAMS", "INGESTED", "LOCATION"],
                            rows)]
        if len(manifest.entries) > len(shown):
            lines.append(f"... {len(manifest.entries) - len(shown)} more (use --limit/--json)")
    return "\n".join(lines)


# --- batch ---------------------------------------------------------------------------------

def _read_location(args: argparse.Namespace) -> bytes:
    location: str = args.location
    parsed = urlparse(location)
    if parsed.scheme == "s3":
        bucket_url = f"s3://{parsed.netloc}/"
        key = parsed.path.lstrip("/")
        store = open_store(bucket_url, store_options(args))
        try:
            return store.get(key).data
        finally:
            store.close()
    path = Path(local_path(location) if parsed.scheme == "file" else location)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"no batch file at {location}") from None


def run_batch(args: argparse.Namespace) -> int:
    data = _read_location(args)
    footer = read_footer(data)
    block, count = decode_block(data)
    envelopes: list[Envelope] = []
    bad = 0
    streams: Counter[str] = Counter()
    for record in iter_records(block, count):
        try:
            envelope = decode_envelope(record)
        except BatchFormatError:
            bad += 1
            continue
        streams[envelope.stream] += 1
        if len(envelopes) < args.records:
            envelopes.append(envelope)
    summary = {
        "location": args.location, "bytes": len(data), "crc32c": crc32c(data),
        "compression": footer.compression.name.lower(), "record_count": footer.record_count,
        "version": footer.version, "uncompressed_bytes": len(block),
        "streams": dict(streams), "bad_envelopes": bad,
        "records": [{"stream": e.stream, "event_id": e.event_id,
                     "received_at_ms": e.received_at_ms,
                     "payload": e.payload.decode("utf-8", "replace")} for e in envelopes],
    }
    if args.json:
        print_json(summary)
        return 0
    print(f"batch     {args.location}  ({len(data):,} bytes, crc32c {crc32c(data):#010x})")
    print(f"footer    version {footer.version}, {footer.compression.name.lower()}, "
          f"{footer.record_count:,} records, {len(block):,} bytes uncompressed")
    print("streams   " + (", ".join(f"{s}={n:,}" for s, n in streams.items()) or "-")
          + (f"  ({bad} malformed envelopes)" if bad else ""))
    if envelopes:
        rows = [[e.stream, e.event_id, iso(e.received_at_ms / 1000),
                 _clip(e.payload.decode("utf-8", "replace"), 60)] for e in envelopes]
        print()
        print(table(["STREAM", "EVENT_ID", "RECEIVED", "PAYLOAD"], rows))
    return 0


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
