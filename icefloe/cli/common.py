"""Helpers shared by CLI commands: store arguments and output formatting."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

import msgspec

from icefloe.store import StoreOptions


def add_store_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--store URL`` plus the S3 endpoint/region overrides."""
    parser.add_argument("--store", required=required, metavar="URL",
                        help="object store: file:///path or s3://bucket/prefix")
    add_s3_arguments(parser)


def add_s3_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint-url", metavar="URL",
                        help="S3-compatible endpoint (MinIO, moto); default: AWS")
    parser.add_argument("--region", help="S3 region; default: the AWS chain's")


def store_options(args: argparse.Namespace) -> StoreOptions:
    """Store options from the common arguments (credentials come from the AWS chain)."""
    if getattr(args, "endpoint_url", None) is None and getattr(args, "region", None) is None:
        return StoreOptions()
    from icefloe.store.s3 import S3Options

    return StoreOptions(s3=S3Options(endpoint_url=args.endpoint_url, region=args.region))


def print_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")


def iso(ts: float) -> str:
    """Seconds since the epoch as a readable UTC timestamp."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
