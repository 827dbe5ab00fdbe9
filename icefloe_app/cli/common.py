"""Helpers shared by CLI commands: store arguments and output formatting."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

import msgspec

from icefloe.store import StoreOptions, options_for
from icefloe_app.cli.config_args import add_config_arguments, config_from_args


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """``--store URL`` (default: the config's store) plus the S3 endpoint/region overrides,
    and ``--config``/``--data-dir`` to find that config."""
    parser.add_argument("--store", metavar="URL",
                        help="object store: file:///path or s3://bucket/prefix (default: "
                             "[store] url of the config, else DATA_DIR/store)")
    add_s3_arguments(parser)
    add_config_arguments(parser, example=True)


def add_s3_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint-url", metavar="URL",
                        help="S3-compatible endpoint (MinIO, moto); default: AWS")
    parser.add_argument("--region", help="S3 region; default: the AWS chain's")


def store_options(args: argparse.Namespace) -> StoreOptions:
    """Store options from the common arguments (credentials come from the AWS chain)."""
    return options_for(getattr(args, "endpoint_url", None), getattr(args, "region", None))


def resolve_store(args: argparse.Namespace) -> None:
    """Fill ``args.store`` (and the S3 settings) from the config when ``--store`` is absent,
    so ``icefloe inspect manifest`` next to ``icefloe up`` needs no flags."""
    if getattr(args, "store", None):
        return
    _, config = config_from_args(args, example=True)
    args.store = config.store.url
    args.control_store = config.store.control_url  # manifest and registry, if apart
    if getattr(args, "endpoint_url", None) is None:
        args.endpoint_url = config.store.endpoint_url
    if getattr(args, "region", None) is None:
        args.region = config.store.region


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
